"""Contract: with --max-restarts 1, a script that fails on TORCHELASTIC_RESTART_COUNT=0 and succeeds on 1
ends the job with 0; each attempt sees its restart count."""
import os
import sys

RANK = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
sys.stdout.write(f"FACT rank={RANK} attempt={attempt} max={os.environ['TORCHELASTIC_MAX_RESTARTS']}\n")
sys.stdout.flush()
if attempt == 0 and RANK == 1:
    raise SystemExit(f"FAILING rank={RANK} on the first attempt")
