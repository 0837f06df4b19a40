"""Contract: with --max-restarts 1, a script that fails on TORCHELASTIC_RESTART_COUNT=0 and succeeds on 1
ends the job with 0; each attempt sees its restart count."""
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
sys.stdout.write(f"FACT rank={RANK} attempt={attempt} max={os.environ['TORCHELASTIC_MAX_RESTARTS']}\n")
sys.stdout.flush()
# Both ranks have printed before one fails (the contract is the restart count, not a start-up race).
Path(sys.argv[1], f"attempt{attempt}-rank{RANK}").touch()
while not all(Path(sys.argv[1], f"attempt{attempt}-rank{r}").exists() for r in (0, 1)):
    time.sleep(0.02)
if attempt == 0 and RANK == 1:
    raise SystemExit(f"FAILING rank={RANK} on the first attempt")
