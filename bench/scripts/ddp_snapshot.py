"""A DDP training script in the style of the PyTorch DDP tutorial (`multigpu_torchrun.py`): it keeps
its own snapshot with torch.save, resumes from it with torch.load, and knows nothing of resctl.

Used by bench/bench_kill_resume.py under torchrun and under resctl alike. It prints one line per
optimizer step, `STEP <rank> <step> <unix time>`, and `PID <rank> <pid>` at start, so the benchmark
can kill a worker and time the resume from the outside, the same way for both launchers.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def block_in_native_code(device: torch.device) -> None:
    """An hour in native code: the main thread never returns to Python, so no Python signal handler runs."""
    if device.type == "cuda":
        torch.cuda._sleep(3600 * 2_000_000_000)  # ~an hour of GPU clock cycles
        torch.cuda.synchronize()
    else:
        ctypes.CDLL(None).sleep(3600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--snapshot", default="snapshot.pt")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--backend", default="")
    ap.add_argument("--out", default="")
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds of pretend compute per step")
    ap.add_argument("--block-at", default="", metavar="STEP:RANK",
                    help="first launcher cycle only: after STEP, RANK blocks in native code for an hour (on CUDA a "
                    "spinning kernel and a synchronize, on CPU a C sleep), as a survivor whose peer died does")
    args = ap.parse_args()
    block_step, _, block_rank = args.block_at.partition(":")
    block = (int(block_step), int(block_rank or 0)) if block_step else None
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        block = None

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group(args.backend or ("nccl" if device.type == "cuda" else "gloo"))
    rank = dist.get_rank()
    print(f"PID {rank} {os.getpid()}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.width, args.width), nn.ReLU(), nn.Linear(args.width, 1)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    first = 1
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, map_location=device, weights_only=True)
        model.module.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optim"])
        first = snap["step"] + 1
        print(f"Resuming training from snapshot at step {snap['step']}", flush=True)
    for step in range(first, args.steps + 1):
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(64, args.width, generator=g).to(device)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()  # the step is done on the device before its line is printed
        if args.step_time:
            time.sleep(args.step_time)
        print(f"STEP {rank} {step} {time.time():.6f}", flush=True)
        if block == (step, rank):
            block_in_native_code(device)
        if rank == 0 and step % args.save_every == 0:
            tmp = args.snapshot + ".tmp"
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.snapshot)
    dist.barrier()
    if rank == 0 and args.out:
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
