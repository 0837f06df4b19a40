"""Contract: with --max-restarts 1, a rank that always fails is tried twice and the job fails."""
import os
import sys

RANK = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
sys.stdout.write(f"FACT rank={RANK} attempt={attempt}\n")
sys.stdout.flush()
if RANK == 1:
    sys.exit(2)
