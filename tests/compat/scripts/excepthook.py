"""Contract: a sys.excepthook the script sets is called for its uncaught exception (every rank)."""
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])


def both(name):
    Path(sys.argv[1], f"{name}{RANK}").touch()
    deadline = time.monotonic() + 60
    while not all(Path(sys.argv[1], f"{name}{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.02)


def hook(kind, value, tb):
    sys.stderr.write(f"HOOK rank={RANK} {kind.__name__}: {value}\n")
    sys.stderr.flush()
    both("hooked")  # the first rank to exit gets its peer stopped: each waits for the other's line


sys.excepthook = hook
both("rank")  # both ranks fail at the same moment
raise ValueError("handled by the hook")
