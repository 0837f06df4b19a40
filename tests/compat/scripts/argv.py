"""Contract: sys.argv is [the script's path, its arguments...] exactly as typed."""
import os
import sys

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} argv0={sys.argv[0]}\n")
sys.stdout.write(f"FACT rank={RANK} args={sys.argv[1:]!r}\n")
