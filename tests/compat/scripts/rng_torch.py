"""Contract: torch's unseeded generator is each worker's own (differs across ranks and runs)."""
import os
import sys

import torch

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} ~initial_seed={torch.initial_seed()}\n")
sys.stdout.write(f"FACT rank={RANK} ~rand={torch.rand(1).item()}\n")
