"""Contract: a restarted worker draws new random numbers (rank 1 fails on the first attempt, --max-restarts 1)."""
import os
import random
import sys

import numpy as np

RANK = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
sys.stdout.write(f"FACT rank={RANK} ~random={random.random()}\n")
sys.stdout.write(f"FACT rank={RANK} ~numpy={np.random.rand()}\n")
sys.stdout.flush()
if attempt == 0 and RANK == 1:
    sys.exit(1)
