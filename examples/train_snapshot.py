"""A torchrun-style DDP script that keeps its own snapshot with torch.save / torch.load.

It knows nothing about resctl: `torchrun --nproc-per-node 2 train_snapshot.py` and
`resctl run --nproc-per-node 2 train_snapshot.py` run it unchanged. Training is deterministic
(fixed seeds, fixed data per step), so a run that was killed and resumed from its snapshot ends
with the same weights as one that never failed.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10_000 * step + rank)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--save-every", type=int, default=5)
    ap.add_argument("--snapshot", default="snapshot.pt")
    ap.add_argument("--step-time", type=float, default=0.05, help="seconds of pretend compute per step")
    ap.add_argument("--out", default="", help="write the final model state here (rank 0)")
    ap.add_argument("--fail-always", action="store_true", help="raise on every attempt (a broken job)")
    ap.add_argument("--direct", action="store_true",
                    help="save straight to --snapshot with the torchrun tutorial's keys (no temp file, no 'step' key)")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    if os.path.exists(args.snapshot):
        snap = torch.load(args.snapshot, weights_only=True)
        if args.direct:
            snap = {"model": snap["MODEL_STATE"], "optim": snap["OPTIMIZER_STATE"], "step": snap["STEPS_RUN"]}
        model.module.load_state_dict(snap["model"])
        opt.load_state_dict(snap["optim"])
        start = snap["step"]
        # one write per line: under PYTHONUNBUFFERED print writes the text and the newline apart, and two ranks
        # resuming at once ran their lines together on the console
        print(f"[rank {rank}] resumed from {args.snapshot} at step {start}\n", end="", flush=True)
    if args.fail_always:
        raise RuntimeError("this job is broken on purpose (--fail-always)")

    for step in range(start + 1, args.steps + 1):
        x, y = batch(step, rank)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_time)
        if rank == 0 and step % args.save_every == 0 and args.direct:
            torch.save({"MODEL_STATE": model.module.state_dict(), "OPTIMIZER_STATE": opt.state_dict(),
                        "STEPS_RUN": step}, args.snapshot)
        elif rank == 0 and step % args.save_every == 0:
            tmp = args.snapshot + ".tmp"
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}, tmp)
            os.replace(tmp, args.snapshot)
        if rank == 0 and step % 10 == 0:
            print(f"[rank 0] step {step} loss {loss.item():.5f}", flush=True)
    dist.barrier()
    if rank == 0 and args.out:
        torch.save(model.module.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
