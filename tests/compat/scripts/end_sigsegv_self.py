"""Contract: a worker (rank 1) that dies of SIGSEGV fails the job with torchrun's exit code."""
import os
import signal
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
done = Path(sys.argv[1]) / "rank0-done"
sys.stdout.write(f"FACT rank={RANK} started=yes\n")
sys.stdout.flush()
if RANK == 0:
    done.touch()
else:
    while not done.exists():
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGSEGV)
