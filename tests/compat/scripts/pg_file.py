"""Contract: init_process_group with a file:// store, all_reduce, destroy."""
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}/pg-store", rank=rank, world_size=world)
t = torch.ones(1)
dist.all_reduce(t)
sys.stdout.write(f"FACT rank={rank} sum={t.item()}\n")
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
