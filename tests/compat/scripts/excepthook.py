"""Contract: a sys.excepthook the script sets is called for its uncaught exception (every rank)."""
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])


def hook(kind, value, tb):
    sys.stderr.write(f"HOOK rank={RANK} {kind.__name__}: {value}\n")
    sys.stderr.flush()


sys.excepthook = hook
Path(sys.argv[1], f"rank{RANK}").touch()  # both ranks fail at the same moment
while not all(Path(sys.argv[1], f"rank{r}").exists() for r in (0, 1)):
    time.sleep(0.02)
raise ValueError("handled by the hook")
