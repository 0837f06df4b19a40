"""A short 2-rank job whose ranks end together (bench/bench_job_end.py): a few Adam steps, a barrier,
then rank 0 prints `DONE <unix time>` and every rank leaves the process group."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
model = torch.nn.Linear(8, 8)
opt = torch.optim.Adam(model.parameters())
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 8)).sum().backward()
    opt.step()
dist.barrier()
if dist.get_rank() == 0:
    print("DONE", time.time(), flush=True)
dist.destroy_process_group()
