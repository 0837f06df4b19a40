"""Contract: a multiprocessing fork Pool runs a function defined in the script."""
import multiprocessing as mp
import os
import sys

RANK = int(os.environ["RANK"])


def square(x):
    return x * x


if __name__ == "__main__":
    with mp.get_context("fork").Pool(2) as pool:
        result = pool.map(square, range(5))
    sys.stdout.write(f"FACT rank={RANK} result={result}\n")
