"""PyTorch's test_script_init_method.py, with a FACT line: the process group from --init-method."""
import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--init-method", required=True)
args = parser.parse_args()
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=args.init_method, world_size=world, rank=rank)
total = torch.ones(1)
dist.all_reduce(total)
port = args.init_method.rsplit(":", 1)[1]
print(f"FACT rank {rank} sum {total.item()} master_port={os.environ['MASTER_PORT'] == port}", flush=True)
dist.destroy_process_group()
