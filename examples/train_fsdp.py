"""FSDP2 training on CPU (gloo): `fully_shard` on each block and on the model, a shuffled DistributedSampler
through a DataLoader, and one of two ways to checkpoint.

    torchrun --nproc-per-node 2 examples/train_fsdp.py --out final.pt
    resctl run -p examples/profiles/local-cpu.toml --set checkpoint.data_position=true \\
        examples/train_fsdp.py --out final.pt
    resctl run -p examples/profiles/local-cpu.toml examples/train_fsdp.py --dcp ckpt-dcp --out final.pt

- default: `resctl.checkpoint` (load at start, `maybe_save` every step); the model's and the optimizer's
  state are DTensors, so resctl writes a sharded (DCP) checkpoint, each rank its own shards. With
  `checkpoint.data_position = true` the loader resumes at the batch after the checkpoint's step.
- `--dcp DIR`: the script checkpoints itself with `torch.distributed.checkpoint`, as torchtitan-,
  accelerate- and Lightning-FSDP-style code does: `dcp.save` (`--async-save`: `dcp.async_save` on a
  gloo group of its own, waited for before the next one) into `DIR/step-N` every `--save-every` steps,
  and at start `dcp.load` of the newest `DIR/step-N` with DCP's `.metadata` (written last); it skips the
  resumed epoch's trained batches itself. It knows nothing of resctl (`resctl report` still counts its
  checkpoints and resumes: docs/frameworks.md).

Everything that decides the result is a pure function of its inputs (seeded init, seeded sampler, a
fixed world size), so a run killed and resumed from its newest checkpoint ends with a model and
optimizer state bitwise equal to an uninterrupted run (tests/integration/test_fsdp_recovery.py).
`--out PATH` (rank 0) writes the full model and optimizer state and the step at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import resctl.checkpoint as checkpoint


def build(width: int, layers: int, world: int) -> nn.Module:
    torch.manual_seed(1234)  # every rank builds the same full model, then keeps its shards
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, width))
                            for _ in range(layers)], nn.Linear(width, 1))
    mesh = init_device_mesh("cpu", (world,))
    for block in list(model)[:-1]:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def loader_of(samples: int, width: int, batch: int) -> DataLoader[Any]:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(samples, width, generator=g)
    data = TensorDataset(x, x[:, : width // 2].sum(dim=1, keepdim=True).tanh())
    return DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, shuffle=True, seed=0))


def newest_dcp(root: str) -> tuple[int, str] | None:
    """The newest complete `root/step-N` (DCP writes `.metadata` last, on rank 0)."""
    found = []
    for name in os.listdir(root) if os.path.isdir(root) else []:
        m = re.fullmatch(r"step-(\d+)", name)
        if m and os.path.exists(os.path.join(root, name, ".metadata")):
            found.append((int(m.group(1)), os.path.join(root, name)))
    return max(found) if found else None


class OwnDCP:
    """The script's own DCP checkpoints (`--dcp`): no resctl in here."""

    def __init__(self, root: str, every: int, async_save: bool) -> None:
        self.root, self.every = root, every
        self.group = dist.new_group(backend="gloo") if async_save else None  # async saves' own collectives
        self.pending: Any = None

    def load(self, model: nn.Module, opt: torch.optim.Optimizer) -> int:
        newest = newest_dcp(self.root)
        if newest is None:
            return 0
        step, path = newest
        msd, osd = get_state_dict(model, opt)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return step

    def maybe_save(self, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
        if step % self.every:
            return
        self.wait()
        msd, osd = get_state_dict(model, opt)
        path = os.path.join(self.root, f"step-{step}")
        if self.group is None:
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
        else:
            self.pending = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=path, process_group=self.group)

    def wait(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds of pretend compute per step")
    ap.add_argument("--dcp", default="", help="checkpoint with torch.distributed.checkpoint into DIR instead")
    ap.add_argument("--save-every", type=int, default=5, help="with --dcp: steps between checkpoints")
    ap.add_argument("--async-save", action="store_true", help="with --dcp: dcp.async_save")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build(args.width, args.layers, world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = loader_of(args.samples, args.width, args.batch)
    own = OwnDCP(args.dcp, args.save_every, args.async_save) if args.dcp else None
    state = {"model": model, "optim": opt}
    start = own.load(model, opt) if own is not None else checkpoint.load(state)
    if start:
        print(f"[rank {rank}] resumed from step {start}\n", end="", flush=True)
    step, per_epoch = start, len(loader)
    for epoch in range(start // per_epoch, args.epochs):
        loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
        for i, (x, y) in enumerate(loader):
            if own is not None and epoch * per_epoch + i < start:
                continue  # the script's own resume: skip what it trained before
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if args.step_time:
                time.sleep(args.step_time)
            if own is not None:
                own.maybe_save(model, opt, step)
            else:
                checkpoint.maybe_save(state, step)
    if own is not None:
        own.wait()
    else:
        checkpoint.wait()
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd, osd = get_state_dict(model, opt, options=full)  # collective: every rank
    if rank == 0 and args.out:
        torch.save({"model": msd, "optim": osd, "step": step}, args.out + ".tmp")
        os.replace(args.out + ".tmp", args.out)
        print(f"rank 0: done at step {step}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
