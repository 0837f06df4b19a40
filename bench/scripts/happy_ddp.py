"""A tiny-step DDP loop that times its own steps (bench/bench_happy_path.py); an unmodified
torchrun-style script: no resctl import.

    torchrun --nproc-per-node 2 bench/scripts/happy_ddp.py --steps 300 [--device cuda]

Rank 0 prints `STEPS n=<steps> median_us=<median> mean_us=<mean>` for the steps after the warm-up.
"""

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--width", type=int, default=32)
    args = ap.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(args.width, args.width).to(device), device_ids=[local_rank] if args.device == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, args.width, device=device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        print(f"STEPS n={len(times)} median_us={statistics.median(times) * 1e6:.1f} "
              f"mean_us={statistics.fmean(times) * 1e6:.1f} threads={torch.get_num_threads()}", flush=True)
    dist.barrier()  # every rank done before the group goes (gloo aborts a rank that destroys it early)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
