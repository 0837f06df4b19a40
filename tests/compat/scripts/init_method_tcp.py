"""Contract (PyTorch's launcher test_script_init_method.py): init_process_group with
--init-method=tcp://localhost:<the launcher's --master-port> works under the launcher."""
import argparse
import os
import sys

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--init-method", required=True)
args = ap.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=args.init_method, world_size=world, rank=rank)
t = torch.ones(1)
dist.all_reduce(t)
sys.stdout.write(f"FACT rank={rank} sum={int(t.item())}\n")
sys.stdout.flush()
dist.destroy_process_group()
