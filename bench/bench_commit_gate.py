"""What the memory tier's commit hold costs per step (issue 27, item 4): a training loop (one
process, CPU, a model of `--params` million parameters + Adam, `checkpoint.memory_every = --every`)
in alternating blocks of `--every` x `--cycles` steps, each block under one hold policy:

- `next` (resctl now): the forward after every snapshot waits for that snapshot's commit;
- `due` (the policy merged before it): only the forward of the step that ends in the next
  snapshot waits, for a commit still in flight then (a rollback of up to 2 memory_every - 1);
- `none`: no hold (no step every rank holds after some kills, with two slots).

Reported per policy: the mean step time (a hold falls on one step in `--every`, so a median would
hide it), the median of the blocks' means, and the seconds the forwards waited per snapshot.

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
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from resctl.checkpoint import memdir
from resctl.checkpoint.engine import Checkpointer
from resctl.checkpoint.memory import MemoryTier

POLICIES = ("next", "due", "none")
HOLD = MemoryTier._gate_next_forward
held: list[float] = []  # seconds each hold waited, this block


def timed_hold(self: MemoryTier, commit: Future[None]) -> None:
    """The product's hold, with the wait it causes recorded."""
    def timed(f: Future[None] = commit) -> None:
        t0 = time.perf_counter()
        wait_futures([f])
        held.append(time.perf_counter() - t0)
    if self._gate is not None:
        self._gate.remove()

    def gate(_m: Any, _a: Any) -> None:
        handle.remove()
        if self._gate is handle:
            self._gate = None
        timed()

    handle = self._gate = torch.nn.modules.module.register_module_forward_pre_hook(gate)


def block(ck: Checkpointer, policy: str, every: int, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int,
          start: int) -> list[float]:
    MemoryTier._gate_next_forward = timed_hold if policy == "next" else (lambda self, commit: None)  # type: ignore
    x = torch.randn(32, model[0].in_features)
    times = []
    for step in range(start, start + steps):
        t0 = time.perf_counter()
        tier = ck.memory._memory
        if policy == "due" and step % every == 0 and tier is not None and tier._commit is not None:
            if not tier._commit.done():
                timed_hold(tier, tier._commit)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        ck.maybe_save({"model": model, "optim": opt}, step)
        times.append(time.perf_counter() - t0)
    ck.wait()
    return times


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
                held.clear()
                times[p].append(block(ck, p, a.every, model, opt, steps, step))
                waits[p].append(sum(held) / a.cycles)
                step += steps
        MemoryTier._gate_next_forward = HOLD  # type: ignore[method-assign]
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
