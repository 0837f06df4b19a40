"""Contract: what a worker reads from stdin when the launcher's stdin is a pipe (rank 0 reads it)."""
import os
import sys

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} stdin.is_none={sys.stdin is None}\n")
if sys.stdin is not None:
    sys.stdout.write(f"FACT rank={RANK} stdin.isatty={sys.stdin.isatty()}\n")
    sys.stdout.write(f"FACT rank={RANK} stdin.fileno={sys.stdin.fileno()}\n")
    if RANK == 0:
        sys.stdout.write(f"FACT rank={RANK} read={sys.stdin.read()!r}\n")
