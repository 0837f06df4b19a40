"""Contract: atexit handlers run after an uncaught exception too (rank 1 raises after rank 0 returned)."""
import atexit
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
done = Path(sys.argv[1]) / "rank0-done"
atexit.register(lambda: sys.stdout.write(f"ATEXIT rank={RANK} flushed\n"))
if RANK == 0:
    done.touch()
else:
    while not done.exists():
        time.sleep(0.02)
    raise RuntimeError(f"crash rank={RANK}")
