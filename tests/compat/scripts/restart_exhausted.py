"""Contract: with --max-restarts 1, a rank that always fails is tried twice and the job fails."""
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
sys.stdout.write(f"FACT rank={RANK} attempt={attempt}\n")
sys.stdout.flush()
# Both ranks have printed before one fails (the contract is the restart count, not a start-up race).
Path(sys.argv[1], f"attempt{attempt}-rank{RANK}").touch()
while not all(Path(sys.argv[1], f"attempt{attempt}-rank{r}").exists() for r in (0, 1)):
    time.sleep(0.02)
if RANK == 1:
    sys.exit(2)
