"""Contract: lines printed without flush are all shown when the script returns, in order."""
import os

RANK = int(os.environ["RANK"])
for i in range(5):
    print(f"OUT rank={RANK} line {i}")
