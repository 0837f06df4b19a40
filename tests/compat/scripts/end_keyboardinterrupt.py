"""Contract: KeyboardInterrupt raised in a worker (rank 1) prints its traceback and fails the job."""
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
done = Path(sys.argv[1]) / "rank0-done"
sys.stdout.write(f"FACT rank={RANK} started=yes\n")
if RANK == 0:
    done.touch()
else:
    while not done.exists():
        time.sleep(0.02)
    raise KeyboardInterrupt
