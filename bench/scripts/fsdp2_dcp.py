"""An FSDP2 training script that keeps its own sharded snapshot with torch.distributed.checkpoint (DCP)
and knows nothing of resctl; used by bench/bench_kill_resume.py under torchrun and under resctl alike.

The model is built on the meta device, sharded with `fully_shard`, materialised with `to_empty` and
initialised with `reset_parameters()` on the sharded (DTensor) parameters, as FSDP2 recommends. The
data of a step is a pure function of (step, rank), so a run resumed from a snapshot ends bitwise equal
to one that never failed. Prints `PID <rank> <pid>` and `STEP <rank> <step> <unix time>` lines;
`--out` (rank 0) writes the full model and optimizer state for a bitwise comparison.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--snapshot", default="snapshot-dcp")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default="")
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds of pretend compute per step")
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        torch.use_deterministic_algorithms(True)  # with CUBLAS_WORKSPACE_CONFIG=:4096:8
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"PID {rank} {os.getpid()}", flush=True)
    mesh = init_device_mesh(args.device, (world,))
    torch.manual_seed(0)
    with torch.device("meta"):
        model = nn.Sequential(*[Block(args.width) for _ in range(args.layers)], nn.Linear(args.width, 1))
    for block in model[:-1]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device=args.device)
    for module in model.modules():
        if hasattr(module, "reset_parameters"):
            module.reset_parameters()  # random ops on sharded (DTensor) parameters
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first = 1
    marker = os.path.join(args.snapshot, "step.txt")
    if os.path.exists(marker):
        with open(marker) as f:
            saved = int(f.read())
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=os.path.join(args.snapshot, f"step-{saved}"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        first = saved + 1
        print(f"Resuming training from snapshot at step {saved}", flush=True)
    for step in range(first, args.steps + 1):
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, args.width, generator=g).to(args.device)
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
        if args.step_time:
            time.sleep(args.step_time)
        print(f"STEP {rank} {step} {time.time():.6f}", flush=True)
        if step % args.save_every == 0:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(args.snapshot, f"step-{step}"))
            dist.barrier()
            if rank == 0:
                with open(marker + ".tmp", "w") as f:
                    f.write(str(step))
                os.replace(marker + ".tmp", marker)
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0 and args.out:
        torch.save({"model": msd, "optim": osd}, args.out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
