"""Contract: os._exit(0) ends the job with 0."""
import os
import sys

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} ending=os._exit(0)\n")
sys.stdout.flush()
os._exit(0)
