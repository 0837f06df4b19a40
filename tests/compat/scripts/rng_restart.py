"""Contract: a restarted worker draws new random numbers (rank 1 fails on the first attempt, --max-restarts 1)."""
import os
import random
import sys
import time

import numpy as np

RANK = int(os.environ["RANK"])
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
drawn = os.path.join(sys.argv[1], f"drawn-{attempt}")  # rank 0 has said its numbers (a file of this run's dir)
sys.stdout.write(f"FACT rank={RANK} ~random={random.random()}\n")
sys.stdout.write(f"FACT rank={RANK} ~numpy={np.random.rand()}\n")
sys.stdout.flush()
if RANK == 0:
    open(drawn, "w").close()
if attempt == 0 and RANK == 1:
    # Fail once rank 0 has said its numbers: a launcher stops the other ranks when one fails, and a rank 0 that was
    # still importing numpy then (a loaded box) would say fewer lines under one launcher than under the other.
    deadline = time.monotonic() + 60
    while not os.path.exists(drawn) and time.monotonic() < deadline:
        time.sleep(0.05)
    sys.exit(1)
