"""Contract: a script that never destroys its process group still ends with 0 (and prints what torch prints)."""
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", init_method="env://")
t = torch.ones(1)
dist.all_reduce(t)
dist.barrier()
sys.stdout.write(f"FACT rank={dist.get_rank()} sum={t.item()}\n")
sys.stdout.flush()
