"""Contract: SIGTERM to a worker with no handler (rank 1) kills it; the job fails as under torchrun."""
import os
import sys
import time

RANK = int(os.environ["RANK"])
sys.stdout.write(f"READY rank={RANK} pid={os.getpid()}\n")
sys.stdout.flush()
time.sleep(30)
sys.stdout.write(f"OUT rank={RANK} not killed\n")
