"""Contract: rank 1 fails while rank 0 waits; rank 0 is stopped, its lines so far are shown, the job fails."""
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
waiting = Path(sys.argv[1]) / "rank0-waiting"
if RANK == 0:
    for i in range(3):
        sys.stdout.write(f"OUT rank=0 line {i}\n")
    sys.stdout.flush()
    waiting.touch()
    time.sleep(60)
    sys.stdout.write("OUT rank=0 never\n")
else:
    while not waiting.exists():
        time.sleep(0.02)
    raise RuntimeError(f"rank 1 failed rank={RANK}")
