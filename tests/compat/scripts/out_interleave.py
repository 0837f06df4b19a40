"""Contract: prints to stdout and stderr, unflushed, reach the console in torchrun's order per rank."""
import os
import sys
import time

RANK = int(os.environ["RANK"])
time.sleep(0.1 * RANK)  # the two ranks print at different moments
for i in range(3):
    print(f"OUT rank={RANK} {i}")
    print(f"ERR rank={RANK} {i}", file=sys.stderr)
