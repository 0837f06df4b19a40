"""Contract: 400 lines per rank (more than a pipe buffer) all arrive, in order per rank."""
import os

RANK = int(os.environ["RANK"])
for i in range(400):
    print(f"OUT rank={RANK} {i:04d} " + "x" * 40)
