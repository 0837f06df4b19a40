"""Contract: init_process_group with its own tcp:// address (not the launcher's) and explicit rank/world size."""
import os
import sys

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=rank, world_size=world)
t = torch.ones(1)
dist.all_reduce(t)
sys.stdout.write(f"FACT rank={rank} sum={t.item()}\n")
sys.stdout.flush()
dist.barrier()
dist.destroy_process_group()
