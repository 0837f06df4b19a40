"""Contract: raise SystemExit (no value) ends the job with 0."""
import os
import sys

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} ending=raise SystemExit\n")
raise SystemExit
