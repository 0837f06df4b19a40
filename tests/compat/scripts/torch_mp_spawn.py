"""Contract: torch.multiprocessing.spawn runs a function defined in the script in fresh processes."""
import os
import sys
import tempfile
import time

import torch.multiprocessing as tmp

RANK = int(os.environ["RANK"])


def child(index, rank):
    # In index order, so that every launcher's output compares line by line: the second child
    # waits for the first's mark (a file named after their parent, which spawned both).
    mark = os.path.join(tempfile.gettempdir(), f"torch_mp_spawn-{os.getppid()}-0")
    while index and not os.path.exists(mark):
        time.sleep(0.01)
    sys.stdout.write(f"CHILD rank={rank} index={index}\n")
    sys.stdout.flush()
    if index == 0:
        open(mark, "w").close()


if __name__ == "__main__":
    tmp.spawn(child, args=(RANK,), nprocs=2, join=True)
    os.unlink(os.path.join(tempfile.gettempdir(), f"torch_mp_spawn-{os.getpid()}-0"))
    sys.stdout.write(f"FACT rank={RANK} spawned=2\n")
