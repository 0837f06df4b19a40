"""Contract: init_process_group with a tcp:// address built from MASTER_ADDR/MASTER_PORT and explicit
rank/world size (a common hand-written init), all_reduce, destroy."""
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world)
t = torch.ones(1)
dist.all_reduce(t)
sys.stdout.write(f"FACT rank={rank} sum={t.item()}\n")
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
