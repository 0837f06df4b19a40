"""Contract: torch.multiprocessing.spawn runs a function defined in the script in fresh processes."""
import os
import sys

import torch.multiprocessing as tmp

RANK = int(os.environ["RANK"])


def child(index, rank):
    sys.stdout.write(f"CHILD rank={rank} index={index}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    tmp.spawn(child, args=(RANK,), nprocs=2, join=True)
    sys.stdout.write(f"FACT rank={RANK} spawned=2\n")
