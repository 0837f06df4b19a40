"""Contract: sys.exit(3) on every rank fails the job with torchrun's exit code."""
import os
import sys

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} ending=sys.exit(3)\n")
sys.exit(3)
