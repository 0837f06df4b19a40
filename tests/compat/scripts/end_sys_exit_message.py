"""Contract: sys.exit("message") on every rank prints the message on stderr and fails the job."""
import os
import signal
import sys
import time
from pathlib import Path

# The launcher SIGTERMs the other rank as soon as it sees the first exit: without this, whether that rank's
# message is printed first was a race in torchrun's own run too (lost there on a loaded CI machine).
signal.signal(signal.SIGTERM, signal.SIG_IGN)
RANK = int(os.environ["RANK"])
Path(sys.argv[1], f"rank{RANK}").touch()  # both ranks end at the same moment
while not all(Path(sys.argv[1], f"rank{r}").exists() for r in (0, 1)):
    time.sleep(0.02)
sys.exit(f"FATAL rank={RANK} bad configuration")
