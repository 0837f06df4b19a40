"""Contract: init_process_group("gloo") from the environment (env://), all_reduce, destroy_process_group."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.tensor([rank + 1.0])
dist.all_reduce(t)
sys.stdout.write(f"FACT rank={rank} world={dist.get_world_size()} sum={t.item()} backend={dist.get_backend()}\n")
sys.stdout.flush()
dist.destroy_process_group()
sys.stdout.write(f"FACT rank={rank} initialized_after_destroy={dist.is_initialized()}\n")
