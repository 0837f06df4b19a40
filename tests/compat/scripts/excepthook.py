"""Contract: a sys.excepthook the script sets is called for its uncaught exception."""
import os
import sys

RANK = int(os.environ["RANK"])


def hook(kind, value, tb):
    sys.stderr.write(f"HOOK rank={RANK} {kind.__name__}: {value}\n")
    sys.stderr.flush()


sys.excepthook = hook
raise ValueError("handled by the hook")
