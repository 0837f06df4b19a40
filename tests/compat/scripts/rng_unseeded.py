"""Contract: unseeded random, NumPy and str hashes are each worker's own (differ across ranks and runs)."""
import os
import random
import sys

import numpy as np

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} ~random={random.random()}\n")
sys.stdout.write(f"FACT rank={RANK} ~numpy={np.random.rand()}\n")
sys.stdout.write(f"FACT rank={RANK} ~numpy_generator={np.random.default_rng().random()}\n")
sys.stdout.write(f"FACT rank={RANK} ~str_hash={hash('compat')}\n")
sys.stdout.write(f"FACT rank={RANK} hash_randomization={sys.flags.hash_randomization}\n")
