"""A new user's data-parallel script: a shuffled DistributedSampler through a DataLoader with workers,
the epoch derived from the resumed step, `resctl.checkpoint` as the README shows.

    torchrun --nproc-per-node 2 examples/train_loader.py --out final.pt
    resctl run -p examples/profiles/local-cpu.toml --set checkpoint.data_position=true \\
        examples/train_loader.py --out final.pt

Without a data position a resumed run starts its epoch from the first batch again (batches trained
twice, more steps than planned, other weights). With `checkpoint.data_position = true` (zero edit),
or `--explicit` (the loader placed in the checkpoint state), the loader continues where the
checkpoint was taken and the run ends bitwise equal to an uninterrupted one
(tests/integration/test_data_position.py).

`--snapshot PATH` keeps the script's own torch.save snapshot instead (rank 0, every 5 steps); with
`checkpoint.intercept_torch_save` matching it and `checkpoint.data_position = true`, the snapshot
carries the loaders' positions too.

`--skip-itself` makes the script skip the batches of the resumed epoch it already trained itself (the
other common way to resume); resctl notices and does not skip them a second time.

`--per-rank` gives each rank its own shard of the data, shuffled by a RandomSampler whose generator is
seeded by the rank (no DistributedSampler): a loader whose position differs per rank.

`--epoch-state` keeps the epoch in the checkpoint state instead of deriving it from the step (what a
script does whose world size may change between runs); `--max-steps N` ends the run after step N;
`--trace PATH` appends every trained batch's sample indices to `PATH.rank<R>` (one JSON line a step).

`--out PATH` (rank 0) writes `{"model": ..., "optim": ..., "step": N}` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, Sampler, Subset, TensorDataset

import resctl.checkpoint as checkpoint


def dataset(samples: int, width: int) -> TensorDataset:
    """(x, y, the sample's index): the index only for `--trace`."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(samples, width, generator=g)
    return TensorDataset(x, x[:, : width // 2].sum(dim=1, keepdim=True).tanh(), torch.arange(samples))


def loader_of(data: TensorDataset, args: argparse.Namespace, rank: int, world: int) -> DataLoader:
    if args.per_rank:
        shard = Subset(data, range(rank, len(data), world))
        sampler: Sampler = RandomSampler(shard, generator=torch.Generator().manual_seed(100 + rank))
        data = shard  # type: ignore[assignment]
    else:
        sampler = DistributedSampler(data, shuffle=True, seed=0)
    return DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.num_workers,
                      persistent_workers=args.persistent and args.num_workers > 0)


def average_gradients(model: nn.Module, world: int) -> None:
    """One all-reduce over a fixed flat layout (see examples/train_ckpt.py: DDP's re-bucketing
    would change gloo's summation order after a resume)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=6)
    # Not `--workers`: ft_launcher's argparse would take it for an abbreviation of its --workers-stop-timeout.
    ap.add_argument("--num-workers", type=int, default=2, help="the DataLoader's worker processes")
    ap.add_argument("--persistent", action="store_true", help="persistent_workers=True")
    ap.add_argument("--step-time", type=float, default=0.0)
    ap.add_argument("--explicit", action="store_true", help="put the loader in the checkpoint state")
    ap.add_argument("--skip-itself", action="store_true", help="skip the resumed epoch's trained batches itself")
    ap.add_argument("--snapshot", default="", help="keep its own torch.save snapshot here every 5 steps "
                    "(rank 0) and resume from it, instead of resctl.checkpoint")
    ap.add_argument("--per-rank", action="store_true", help="each rank its own shard and rank-seeded order")
    ap.add_argument("--epoch-state", action="store_true", help="keep the epoch in the checkpoint state")
    ap.add_argument("--max-steps", type=int, default=0, help="end after this step (0: all epochs)")
    ap.add_argument("--trace", default="", help="append each step's sample indices to PATH.rank<R>")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    width = 8
    data = dataset(args.samples, width)
    loader = loader_of(data, args, rank, world)
    sampler = loader.sampler
    torch.manual_seed(1234)
    model = nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    state: dict[str, object] = {"model": model, "optim": opt}
    if args.explicit:
        state["loader"] = loader
    if args.epoch_state:
        state["progress"] = {"epoch": 0}

    if args.snapshot:  # a torchrun-style script's own snapshot (zero-edit: checkpoint.intercept_torch_save)
        start = 0
        if os.path.exists(args.snapshot):
            snap = torch.load(args.snapshot, weights_only=True)
            model.load_state_dict(snap["model"])
            opt.load_state_dict(snap["optim"])
            start = snap["step"]
    else:
        start = checkpoint.load(state)
    step = start
    steps_per_epoch = len(loader)
    first = state["progress"]["epoch"] if args.epoch_state else start // steps_per_epoch  # type: ignore[index]
    trace = open(f"{args.trace}.rank{rank}", "a") if args.trace else None
    for epoch in range(first, args.epochs):
        if isinstance(sampler, DistributedSampler):
            sampler.set_epoch(epoch)
        if args.epoch_state:
            state["progress"] = {"epoch": epoch}
        for i, (x, y, index) in enumerate(loader):
            if args.skip_itself and epoch * steps_per_epoch + i < start:
                continue  # already trained before the restart
            if trace is not None:
                trace.write(json.dumps({"epoch": epoch, "step": step + 1, "indices": index.tolist()}) + "\n")
                trace.flush()
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            average_gradients(model, world)
            opt.step()
            step += 1
            if args.step_time:
                time.sleep(args.step_time)
            if not args.snapshot:
                checkpoint.maybe_save(state, step)
            elif rank == 0 and step % 5 == 0:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, args.snapshot)
            if step == args.max_steps:
                break
        if step == args.max_steps:
            break
    if trace is not None:
        trace.close()
    checkpoint.wait()
    if rank == 0 and args.out:
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": step}, args.out)
        print(f"rank 0: done at step {step}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
