"""Contract: sys.exit("message") prints the message on stderr and fails the job."""
import os
import sys

RANK = int(os.environ["RANK"])
sys.exit(f"FATAL rank={RANK} bad configuration")
