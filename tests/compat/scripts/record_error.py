"""Contract: @record writes the worker's error (rank 1) to TORCHELASTIC_ERROR_FILE; the launcher's failure
summary shows it."""
import os
import sys
import time
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record

RANK = int(os.environ["RANK"])


@record
def main():
    done = Path(sys.argv[1]) / "rank0-done"
    if RANK == 0:
        done.touch()
        return
    while not done.exists():
        time.sleep(0.02)
    raise ValueError(f"RECORDED rank={RANK} failure")


if __name__ == "__main__":
    main()
