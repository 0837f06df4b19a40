"""What the data position costs (resctl/checkpoint/dataposition.py, checkpoint.data_position).

1. Resume: the time `iter(loader)` takes for a loader resumed mid-epoch, at 10^6 and 10^8 samples
   (DistributedSampler, 2 ranks, shuffled, batch 8), with the position near the start, in the middle
   and near the end of the epoch. It includes DistributedSampler's own epoch start (a randperm of
   the whole dataset and its subsampling), which the uninterrupted run pays at every epoch too and is
   reported on its own line; the fast-forward itself must not grow with the samples skipped. A
   RandomSampler row shows the same for its order.
2. Per step: a training loop's step (next batch, optimizer step, `resctl.checkpoint.maybe_save` on a
   step that does not save) with position tracking on (zero-edit mode) and off, in alternating
   blocks; and the two per-step pieces alone (`with_positions` of a 3-entry state, the optimizer
   step counter). Target: <= 2 us a step.
3. Per save on a rank > 0: its own position file (`resctl.checkpoint.rankside`): the position of one
   loader mid-epoch (`state_dict()`), encoding, the write (aside, rename) into a temp directory, and
   the fsyncs, which run in the background writer when saves are async.

    python bench/bench_data_position.py                      # 10^6 and 10^8 samples (~4 GB at 10^8)
    python bench/bench_data_position.py --sizes 1000000      # quick
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, RandomSampler

import resctl.checkpoint as api
from resctl.checkpoint import dataposition as dp
from resctl.checkpoint import rankside


class Indices(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def position(n: int, batches: int, kind: str) -> dict[str, Any]:
    """A recorded position `batches` into epoch 3 (taken the way a checkpoint takes it)."""
    loader = make(n, kind)
    entry = dp.entry_for(f"rec-{kind}-{n}-{batches}", loader)
    track = dp.REGISTRY.track(loader, entry.key)
    track.start = track._record_start(loader)
    track.offset, track.stream_len = batches, len(loader)
    rec = dp.decode(track.position())
    rec["done"] = False
    return rec


def make(n: int, kind: str) -> DataLoader[int]:
    ds = Indices(n)
    if kind == "distributed":
        sampler: Any = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=0)
        sampler.set_epoch(3)
    else:
        sampler = RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    return DataLoader(ds, batch_size=8, sampler=sampler)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def resume_rows(n: int, kind: str, repeats: int) -> list[str]:
    rows = []
    base = make(n, kind)
    # The sampler's own index work for an epoch (a RandomSampler draws its last permutation lazily).
    work = (lambda: next(iter(base.sampler))) if kind == "distributed" else (lambda: sum(1 for _ in base.sampler))
    start = statistics.median(timed(work) for _ in range(repeats))
    rows.append(f"| {kind} | {n:.0e} | the sampler's index work for one epoch (the uninterrupted run's too) | - "
                f"| {start:.3f} s | |")
    length = len(base)
    for frac in (0.01, 0.5, 0.99):
        batches = int(length * frac)
        rec = position(n, batches, kind)

        def resume() -> None:
            loader = make(n, kind)
            dp.entry_for(f"resume-{kind}-{n}", loader).load_state_dict(rec)
            it = iter(loader)
            next(it)

        t = statistics.median(timed(resume) for _ in range(repeats))
        rows.append(f"| {kind} | {n:.0e} | resume at {frac:.0%} of the epoch (all of it) | {batches * 8:,} | "
                    f"{t:.3f} s | {t - start:+.3f} s |")
    if kind == "distributed":  # the fast-forward alone, past the sampler's own list
        indices = list(iter(base.sampler))
        for frac in (0.01, 0.5, 0.99):
            skip = int(length * frac) * 8

            def forward() -> None:
                next(dp.batched(dp.skip_into(iter(indices), skip), 8, False))

            t = min(timed(forward) for _ in range(101))
            rows.append(f"| {kind} | {n:.0e} | the fast-forward alone at {frac:.0%} | {skip:,} | {t * 1e6:.1f} us | |")
        del indices
    return rows


def loop_block(loader: DataLoader[Any], state: dict[str, Any], opt: torch.optim.Optimizer, steps: int) -> float:
    it = iter(loader)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        next(it)
        opt.step()
        api.maybe_save(state, step)
    return (time.perf_counter() - t0) / steps


def per_step(blocks: int, steps: int) -> list[str]:
    api.configure(dir=tempfile.mkdtemp(prefix="bench-dp-"), interval_steps=10**9, async_=False)
    model = torch.nn.Linear(4, 1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    data = torch.zeros(steps * 2, 4)
    state: dict[str, Any] = {"model": model, "opt": opt, "meta": {"epoch": 0}}
    on, off = [], []
    for _ in range(blocks):
        dp.uninstall()
        off.append(loop_block(DataLoader(data, batch_size=1), state, opt, steps))
        dp.install_auto()
        on.append(loop_block(DataLoader(data, batch_size=1), state, opt, steps))
    dp.uninstall()
    m_on, m_off = statistics.median(on), statistics.median(off)
    dp.install_auto()
    # The best of many short runs: the pieces' own cost, without the other jobs' preemptions.
    wrap = min(timeit.repeat(lambda: dp.with_positions(state), number=2000, repeat=300)) / 2000
    hook = min(timeit.repeat(dp._Steps.hook, number=2000, repeat=300)) / 2000
    dp.uninstall()
    return [
        f"| loop step, tracking off | {m_off * 1e6:.2f} us |",
        f"| loop step, tracking on (zero-edit) | {m_on * 1e6:.2f} us |",
        f"| difference (median of {blocks} blocks of {steps} steps) | {(m_on - m_off) * 1e6:+.2f} us |",
        f"| with_positions(state) per maybe_save (best of 300 x 2000) | {wrap * 1e6:.2f} us |",
        f"| optimizer step counter hook (best of 300 x 2000) | {hook * 1e6:.2f} us |",
        f"| per step, the two pieces | {(wrap + hook) * 1e6:.2f} us |",
    ]


def per_save(saves: int) -> list[str]:
    """A rank > 0's own position file per save: taking the position, encoding it, writing it."""
    loader = make(10**6, "distributed")
    entry = dp.entry_for("per-save", loader)
    it = iter(loader)
    next(it)
    root = tempfile.mkdtemp(prefix="bench-dp-rank-")
    take, enc, write, durable, size = [], [], [], [], 0
    for step in range(1, saves + 1):
        t0 = time.perf_counter()
        rec = entry.state_dict()
        t1 = time.perf_counter()
        data = rankside.encode({"loader": rec}, step=step, rank=1, world_size=2, run_id="bench")
        t2 = time.perf_counter()
        path = rankside.write(Path(root), 1, step, data)
        t3 = time.perf_counter()
        rankside.sync(path)
        t4 = time.perf_counter()
        take.append(t1 - t0)
        enc.append(t2 - t1)
        write.append(t3 - t2)
        durable.append(t4 - t3)
        size = len(data)
    del it
    med = statistics.median
    return [
        f"| the position (state_dict) | {med(take) * 1e3:.3f} ms |",
        f"| encode (torch.save + weights_only check + CRC32) | {med(enc) * 1e3:.3f} ms |",
        f"| write aside and rename, in save | {med(write) * 1e3:.3f} ms |",
        f"| fsync of the file and its directory, in the background writer when async | {med(durable) * 1e3:.3f} ms |",
        f"| file size | {size:,} bytes |",
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000000,100000000", help="dataset sizes; empty: per-step only")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--saves", type=int, default=50, help="saves of a rank > 0's position file (0: none)")
    args = ap.parse_args()
    dp.install()
    print("| sampler | samples | what | samples skipped | time | vs epoch start |\n|---|---|---|---|---|---|")
    for n in (int(v) for v in args.sizes.split(",") if v):
        for kind in ("distributed", "random"):
            if kind == "random" and n > 10**7:
                continue  # RandomSampler at 10^8 needs another ~4 GB; its arithmetic is the same list
            for row in resume_rows(n, kind, args.repeats if n <= 10**7 else 1):
                print(row, flush=True)
    if args.blocks:
        print("\n| per step | cost |\n|---|---|")
        for row in per_step(args.blocks, args.steps):
            print(row, flush=True)
    if args.saves:
        print(f"\n| per save on a rank > 0 (median of {args.saves}) | cost |\n|---|---|")
        for row in per_save(args.saves):
            print(row, flush=True)


if __name__ == "__main__":
    main()
