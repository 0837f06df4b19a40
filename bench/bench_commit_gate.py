"""What the memory tier's commit gate costs (issue 27, item 4): a training loop (one process, CPU,
a model of `--params` million parameters + Adam) with `checkpoint.memory_every = 1`, the step time
with the gate (the next forward waits for the last snapshot's commit) against without it (the
commit overlaps the next step), in alternating blocks.

    python bench/bench_commit_gate.py --params 20 --blocks 6 --steps 10
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from resctl.checkpoint import memdir
from resctl.checkpoint.engine import Checkpointer
from resctl.checkpoint.memory import MemoryTier


def block(ck: Checkpointer, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, start: int) -> float:
    x = torch.randn(32, model[0].in_features)
    times = []
    for step in range(start, start + steps):
        t0 = time.perf_counter()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        ck.maybe_save({"model": model, "optim": opt}, step)
        times.append(time.perf_counter() - t0)
    ck.wait()
    return statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=float, default=20.0, help="millions of parameters")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    width = int((a.params * 1e6 / 2) ** 0.5)
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, width))
    opt = torch.optim.Adam(model.parameters())
    gate = MemoryTier._gate_next_forward
    out: dict[str, list[float]] = {"gate": [], "no_gate": []}
    with tempfile.TemporaryDirectory() as d:
        os.environ[memdir.SHM_ENV] = str(Path(d) / "shm")
        ck = Checkpointer(dir=Path(d) / "ck", interval_steps=10**9, memory_every=1, run_id="bench-gate")
        step = 1
        for b in range(2 * a.blocks):
            on = b % 2 == 0
            MemoryTier._gate_next_forward = gate if on else (lambda self, commit: None)  # type: ignore[method-assign]
            out["gate" if on else "no_gate"].append(block(ck, model, opt, a.steps, step))
            step += a.steps
        MemoryTier._gate_next_forward = gate  # type: ignore[method-assign]
        ck.close()
    med = {k: statistics.median(v) for k, v in out.items()}
    print(json.dumps({"params_m": a.params, "step_s_gate": round(med["gate"], 4),
                      "step_s_no_gate": round(med["no_gate"], 4), "ratio": round(med["gate"] / med["no_gate"], 3),
                      "blocks": {k: [round(x, 4) for x in v] for k, v in out.items()}}))


if __name__ == "__main__":
    main()
