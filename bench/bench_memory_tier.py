"""Benchmark the memory tier (checkpoint.memory_every): save stall and restart restore, side by side.

Measures, in one run, on a Linear+Adam state (bench_checkpoint.Model: params + exp_avg +
exp_avg_sq, fp32, so `--params-m` M parameters are 12 x M MB):

- save:    seconds `save_memory` blocks the loop (median of the warm saves; the first, which
           allocates and maps the slots, apart), next to the copy limit measured in the same run:
           the same tensors copied into preallocated buffers (pinned on CUDA) — what no snapshot
           can beat; plus the background commit (checksum + manifest) from the `ckpt_mem` events.
- restore: a *restarted worker* — a new process that builds the model and a fresh Adam (no state
           yet, as after a restart) and calls `load()` — timed around `load()`, from the memory tier
           and, alternately in fresh processes, from the disk checkpoint of the same step (written by
           the engine from the snapshot; hot in the page cache, the best case for disk).
- efficiency (`--efficiency`, CUDA): the training loop with `memory_every` chosen so the compute
  between snapshots is `--compute-ratio` times the measured copy, against the loop without snapshots.

Examples::

    # CPU box, 1 GiB state (89.5 M parameters)
    python bench/bench_memory_tier.py --params-m 89.5 --device cpu --dir /tmp/bench-mem
    # one H200, 6.44 GB state; host staging, then device staging (see docs/BENCHMARKS.md)
    python bench/bench_memory_tier.py --params-m 537 --device cuda --dir /var/tmp/bench-mem --efficiency
    python bench/bench_memory_tier.py --params-m 537 --device cuda --stage device --dir /var/tmp/bench-mem --efficiency

Prints one JSON document on stdout (progress on stderr); `--json PATH` writes it there too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_checkpoint import Model, contiguous_d2h, staging_limit, sync  # noqa: E402

from resctl.checkpoint import memdir  # noqa: E402
from resctl.checkpoint.engine import Checkpointer  # noqa: E402
from resctl.telemetry.events import EventLog, read_events  # noqa: E402

med = statistics.median
RUN_ID = "bench-memory-tier"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def checkpointer(args: argparse.Namespace, memory_every: int, events: EventLog | None = None) -> Checkpointer:
    return Checkpointer(dir=args.dir, interval_steps=10**9, memory_every=memory_every, run_id=RUN_ID,
                        stage=args.stage, writers=args.writers, events=events, exclusive=False)


def copy_once(bufs: list[torch.Tensor], tensors: list[torch.Tensor]) -> float:
    """One copy of `tensors` into preallocated `bufs` (the limit no snapshot can beat)."""
    on_cuda = any(t.is_cuda for t in tensors)
    sync("cuda" if on_cuda else "cpu")
    t0 = time.perf_counter()
    for b, t in zip(bufs, tensors):
        b.copy_(t, non_blocking=on_cuda)
    sync("cuda" if on_cuda else "cpu")
    return time.perf_counter() - t0


def saves(args: argparse.Namespace, model: Model, ck: Checkpointer) -> dict[str, Any]:
    """Memory saves, each right after one copy-limit measurement (paired: the box is noisy)."""
    state = model.state()
    tensors = model.tensors()
    on_cuda = any(t.is_cuda for t in tensors)
    bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=on_cuda) for t in tensors]
    copy_once(bufs, tensors)
    blocked, limits = [], []
    for step in range(1, args.saves + 2):
        limits.append(copy_once(bufs, tensors))
        sync(args.device)
        t0 = time.perf_counter()
        ck.save_memory(state, step)
        blocked.append(time.perf_counter() - t0)
        ck.wait()  # the commit between saves, as the compute of a step would hide it
        if ck.memory_off:
            raise SystemExit(f"the memory tier turned itself off: {ck.memory_off} (is /dev/shm large enough?)")
    ck.save(state, args.saves + 1, snapshot=None)  # a disk checkpoint of the same step, for the disk restore
    ck.wait()
    # The first save into each of the two slots allocates and maps it (cold).
    del bufs
    return {"cold_s": [round(b, 4) for b in blocked[:2]], "warm_s": [round(b, 4) for b in blocked[2:]],
            "warm_median_s": round(med(blocked[2:]), 4), "paired_limit_s": [round(x, 4) for x in limits[2:]],
            "paired_ratio_median": round(med(b / x for b, x in zip(blocked[2:], limits[2:])), 3)}


CHILD = r"""
import sys, time, json, torch
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/bench")
from bench_memory_tier import rebuild
print(json.dumps(rebuild(sys.argv[2:])), flush=True)
"""


def rebuild(argv: list[str]) -> dict[str, Any]:
    """In a new process: build the model and a fresh optimizer, time load()."""
    params_m, device, ckdir, memory_every, stage = float(argv[0]), argv[1], argv[2], int(argv[3]), argv[4]
    layers = 32 if params_m >= 100 else 4  # bench_checkpoint.Model's shape rule
    hidden = max(64, int(math.sqrt(params_m * 1e6 / layers)) // 64 * 64)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    net = torch.nn.Sequential(*mods).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-5)  # fresh: no state yet, as after a restart
    events = Path(ckdir + f"-child-{os.getpid()}")
    ck = Checkpointer(dir=ckdir, interval_steps=10**9, memory_every=memory_every, run_id=RUN_ID, stage=stage,
                      exclusive=False, events=EventLog(events, rank=0))
    sync(device)
    t0 = time.perf_counter()
    step = ck.load({"model": net, "optim": opt})
    sync(device)
    seconds = time.perf_counter() - t0
    every_tensor = [*net.parameters(), *(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v))]
    (load,) = [e for e in read_events(events) if e["kind"] == "ckpt_load"]
    shutil.rmtree(events, ignore_errors=True)
    return {"step": step, "seconds": seconds, "tier": load["tier"], "checksum": float(sum(t.double().sum() for t in every_tensor))}


def restores(args: argparse.Namespace, model: Model, want_step: int) -> dict[str, Any]:
    out: dict[str, list[float]] = {"memory": [], "disk": []}
    sums = set()
    env = {**os.environ, memdir.SHM_ENV: args.shm, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    for _ in range(args.restores):
        for tier, every in (("memory", 1), ("disk", 0)):
            if tier == "memory":
                # A zero-copy restore hands the slot's pages to the restored state (the slot is
                # detached): snapshot the step again, as the next step of a real job would.
                ck = checkpointer(args, 1)
                ck.save_memory(model.state(), want_step)
                ck.close()
            proc = subprocess.run(
                [sys.executable, "-c", CHILD, str(HERE.parent), str(args.params_m), args.device, args.dir, str(every),
                 args.stage], env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr[-3000:])
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            assert got["step"] == want_step and got["tier"] == tier, (tier, got)
            sums.add(got["checksum"])
            out[tier].append(got["seconds"])
            say(f"restore from {tier}: {got['seconds']:.3f} s")
    assert len(sums) == 1, f"memory and disk restores differ: {sums}"
    return {f"{t}_s": [round(s, 4) for s in v] for t, v in out.items()} | {
        f"{t}_median_s": round(med(v), 4) for t, v in out.items()}


def efficiency(args: argparse.Namespace, model: Model, copy_s: float, stall_s: float) -> dict[str, Any]:
    """Steps/s with snapshots every N steps against the loop without snapshots, for two N: the
    smallest with compute between snapshots >= `--compute-ratio` x the device-to-host copy (the
    background copy finishes before the next snapshot), and the smallest that also keeps the
    measured stall within each `--budget` of the step time (what `tune-interval` plans)."""
    for _ in range(3):
        model.step()
    sync(args.device)
    t0 = time.perf_counter()
    for _ in range(10):
        model.step()
    sync(args.device)
    step_s = (time.perf_counter() - t0) / 10
    by_copy = max(1, math.ceil(args.compute_ratio * copy_s / step_s))
    plans = [("ratio", by_copy)]
    for budget in args.budget:
        plans.append((f"budget {budget}", max(by_copy, math.ceil(stall_s * (1 - budget) / (budget * step_s)))))
    out: dict[str, Any] = {"step_s": round(step_s, 5), "stall_s": stall_s}
    # What a snapshot costs the loop is more than its stall: the background copy and checksum slow
    # the steps around it. The first stall-budget run measures that cost (its snapshots are far enough
    # apart not to wait for each other's commits); a second set of plans budgets it.
    cost_plans_added = False
    while plans:
        name, every = plans.pop(0)
        if every > 400:  # e.g. host staging: its stall is the whole copy
            out[name] = {"memory_every": every, "not_run": "more than 400 steps between snapshots"}
            continue
        # Three snapshot intervals and a half: the window ends between snapshots, as most of a
        # long run does (ending on one would count its background copy's tail as the loop's).
        steps = max(3 * every + every // 2, 50)

        def loop(ck: Checkpointer | None) -> float:
            sync(args.device)
            t = time.perf_counter()
            for s in range(1, steps + 1):
                model.step()
                if ck is not None:
                    ck.maybe_save(model.state(), s)
            sync(args.device)
            return time.perf_counter() - t

        base = loop(None)
        ck = Checkpointer(dir=args.dir, interval_steps=10**9, memory_every=every, run_id=RUN_ID + "-eff",
                          stage=args.stage, exclusive=False)
        ck.save_memory(model.state(), 0)  # the slots are allocated, mapped and pinned outside the timed loop
        ck.wait()
        with_mem = loop(ck)
        ck.release_memory()
        ck.close()
        base = (base + loop(None)) / 2  # the baseline on both sides of the snapshot loop (the GPU's clocks drift)
        snapshots = steps // every
        cost_s = max(0.0, (with_mem - base) / max(1, snapshots))
        out[name] = {"memory_every": every, "compute_over_copy": round(every * step_s / copy_s, 2), "steps": steps,
                     "baseline_s": round(base, 4), "with_memory_s": round(with_mem, 4),
                     "efficiency": round(base / with_mem, 4), "cost_per_snapshot_s": round(cost_s, 5)}
        say(f"efficiency ({name}): memory_every={every}: {base / with_mem:.4f} (cost per snapshot {cost_s * 1e3:.1f} ms)")
        if name.startswith("budget") and not cost_plans_added:
            cost_plans_added = True
            out["cost_per_snapshot_s"] = round(cost_s, 5)
            for budget in args.budget:
                plans.append((f"cost budget {budget}",
                              max(by_copy, math.ceil(max(cost_s, stall_s) * (1 - budget) / (budget * step_s)))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params-m", type=float, default=89.5, help="model parameters in millions (x12 bytes with Adam)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--stage", default="host", choices=("host", "device"))
    ap.add_argument("--dir", default="/tmp/bench-mem", help="disk checkpoint directory (for the disk restore)")
    ap.add_argument("--shm", default=memdir.DEFAULT_ROOT, help="shared-memory root of the tier")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--saves", type=int, default=7, help="warm saves measured")
    ap.add_argument("--restores", type=int, default=3, help="restarted-worker restores per tier")
    ap.add_argument("--efficiency", action="store_true")
    ap.add_argument("--compute-ratio", type=float, default=1.2)
    ap.add_argument("--budget", type=float, nargs="+", default=[0.01, 0.005],
                    help="stall budgets per step for the planned memory_every (one efficiency run each)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    os.environ[memdir.SHM_ENV] = args.shm
    shutil.rmtree(args.dir, ignore_errors=True)
    memdir.release_job(RUN_ID)
    say(f"building the model ({args.params_m} M params) on {args.device}")
    model = Model(args.params_m, args.device, batch=64)
    tensors = model.tensors()
    total = sum(t.numel() * t.element_size() for t in tensors)
    result: dict[str, Any] = {
        "machine": {"host": platform.node(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor()},
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:],
        "state_bytes": total, "tensors": len(tensors), "stage": args.stage,
    }
    say(f"state: {total / 2**30:.3f} GiB in {len(tensors)} tensors; copy limit")
    copy_s = staging_limit(tensors, repeats=5)
    result["copy_limit_s"] = round(copy_s, 4)
    if args.device == "cuda":
        result["d2h_contiguous_s"] = round(contiguous_d2h(total, repeats=5), 4)
    ev_dir = Path(args.dir + "-events")
    shutil.rmtree(ev_dir, ignore_errors=True)
    ck = checkpointer(args, 1, EventLog(ev_dir, rank=0))
    say("memory saves")
    result["save"] = saves(args, model, ck)
    commits = [e["commit"] for e in read_events(ev_dir) if e["kind"] == "ckpt_mem"]
    result["save"]["commit_median_s"] = round(med(commits[2:]), 4)
    result["save"]["ratio_to_copy_limit"] = round(result["save"]["warm_median_s"] / copy_s, 3)
    ck.close()
    say(f"save: {result['save']['warm_median_s']} s warm (copy limit {copy_s:.4f} s); restores")
    result["restore"] = restores(args, model, args.saves + 1)
    memdir.release_job(RUN_ID)  # give the slots back before the efficiency loop takes its own
    if args.efficiency:
        say("efficiency")
        result["efficiency"] = efficiency(args, model, copy_s, result["save"]["warm_median_s"])
    memdir.release_job(RUN_ID)
    shutil.rmtree(args.dir, ignore_errors=True)
    shutil.rmtree(ev_dir, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
