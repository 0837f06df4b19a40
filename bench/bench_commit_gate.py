"""What the memory tier's commit hold costs per step (issues 27 and 31): a training loop (one
process, CPU, a model of `--params` million parameters + Adam, `checkpoint.memory_every = --every`)
in alternating blocks of `--every` x `--cycles` steps, each block under one hold policy:

- `due` (resctl now, issue 31): back-pressure only: the forward of the step that ends in the next
  snapshot waits for a commit still in flight then (rollback <= memory_every + the steps a commit
  spans, at most 2 memory_every - 1);
- `next` (issue 27's strict hold): the forward after every snapshot waits for that snapshot's
  commit (rollback <= memory_every);
- `none`: no hold (no step every rank holds after some kills, with two slots).

Reported per policy: the mean step time (a hold falls on one step in `--every`, so a median would
hide it), the median of the blocks' means, and the seconds the forwards waited per snapshot (the
tier's own count, `MemoryTier._held`, which the next `ckpt_mem` reports).

    python bench/bench_commit_gate.py --params 20 --every 4 --cycles 3 --blocks 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from resctl.checkpoint import memdir
from resctl.checkpoint.engine import Checkpointer
from resctl.checkpoint.memory import MemoryTier

POLICIES = ("next", "due", "none")
HOLD = MemoryTier.hold_if_committing


def block(ck: Checkpointer, policy: str, every: int, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int,
          start: int) -> tuple[list[float], float]:
    """The step times of one block, and the seconds its forwards were held."""
    MemoryTier.hold_if_committing = HOLD if policy != "none" else (lambda self: False)  # type: ignore[method-assign]
    x = torch.randn(32, model[0].in_features)
    times = []
    held = 0.0
    for step in range(start, start + steps):
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        ck.maybe_save({"model": model, "optim": opt}, step)
        tier = ck.memory._memory
        if tier is not None:
            if policy == "next" and step % every == 0:
                tier.hold_if_committing()
            held += tier._held
            tier._held = 0.0
        times.append(time.perf_counter() - t0)
    ck.wait()
    return times, held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=20.0, help="millions of parameters")
    ap.add_argument("--every", type=int, default=4, help="checkpoint.memory_every")
    ap.add_argument("--cycles", type=int, default=3, help="snapshots per block")
    ap.add_argument("--blocks", type=int, default=5, help="blocks per policy")
    ap.add_argument("--policies", default=",".join(POLICIES))
    a = ap.parse_args()
    policies = a.policies.split(",")
    width = int((a.params * 1e6 / 2) ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width))
    opt = torch.optim.Adam(model.parameters())
    steps = a.every * a.cycles
    times: dict[str, list[list[float]]] = {p: [] for p in policies}
    waits: dict[str, list[float]] = {p: [] for p in policies}
    with tempfile.TemporaryDirectory() as d:
        os.environ[memdir.SHM_ENV] = str(Path(d) / "shm")
        ck = Checkpointer(dir=Path(d) / "ck", interval_steps=10**9, memory_every=a.every, run_id="bench-gate")
        step = 1
        block(ck, "none", a.every, model, opt, steps, step)  # warm-up: slots mapped, Adam state made
        step += steps
        for _ in range(a.blocks):
            for p in policies:
                got, held = block(ck, p, a.every, model, opt, steps, step)
                times[p].append(got)
                waits[p].append(held / a.cycles)
                step += steps
        MemoryTier.hold_if_committing = HOLD  # type: ignore[method-assign]
        ck.close()
    out: dict[str, Any] = {"params_m": a.params, "every": a.every, "steps_per_block": steps, "blocks": a.blocks}
    for p in policies:
        means = [statistics.fmean(b) for b in times[p]]
        out[p] = {"mean_step_s": round(statistics.fmean(t for b in times[p] for t in b), 4),
                  "median_block_mean_s": round(statistics.median(means), 4),
                  "hold_per_snapshot_s": round(statistics.median(waits[p]), 4)}
    base = out["due"]["mean_step_s"] if "due" in out else None
    if base:
        out["ratio_vs_due"] = {p: round(out[p]["mean_step_s"] / base, 3) for p in policies}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
