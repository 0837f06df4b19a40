"""Contract: fork Pools made and terminated back to back all run and end (Pool.terminate() SIGTERMs workers that may not have run yet)."""
import multiprocessing as mp
import os
import sys

RANK = int(os.environ["RANK"])


def square(x):
    return x * x


if __name__ == "__main__":
    results = set()
    for _ in range(40):
        with mp.get_context("fork").Pool(2) as pool:
            results.add(tuple(pool.map(square, range(5))))
    sys.stdout.write(f"FACT rank={RANK} results={sorted(results)}\n")
