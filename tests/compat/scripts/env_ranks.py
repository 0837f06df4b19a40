"""Contract: the rank variables of a torchrun worker, with torchrun's values."""
import os
import sys

RANK = int(os.environ["RANK"])
for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
             "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "OMP_NUM_THREADS"):
    sys.stdout.write(f"FACT rank={RANK} {name}={os.environ.get(name)}\n")
