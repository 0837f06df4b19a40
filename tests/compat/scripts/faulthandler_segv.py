"""Contract: faulthandler starts off; once enabled it dumps the traceback of a segfault (rank 1)."""
import faulthandler
import os
import signal
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
done = Path(sys.argv[1]) / "rank0-done"
sys.stdout.write(f"FACT rank={RANK} enabled_at_start={faulthandler.is_enabled()}\n")
sys.stdout.flush()
faulthandler.enable()
if RANK == 0:
    done.touch()
else:
    while not done.exists():
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGSEGV)
