"""Contract: os._exit(7) on every rank fails the job with torchrun's exit code."""
import os
import sys

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} ending=os._exit(7)\n")
sys.stdout.flush()
os._exit(7)
