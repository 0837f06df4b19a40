"""How long one async checkpoint write takes, depending on what runs around it.

    python bench/bench_write_spacing.py                        # CPU state, ~57 MB
    python bench/bench_write_spacing.py --device cuda --width 2048

The interval model (`resctl/tuning/model.py`) takes the write time `W` as one number. This bench
measures it with the `resctl.checkpoint` engine alone (no launcher) in the conditions a job's
interval puts it in: saves back to back (`gap 0`, the back-pressure regime) or spaced out by a
gap, the gap either idle (`sleep`, a GPU job's host) or busy (`compute`: matmuls on the host,
a CPU job), and with pruning on (`keep_last 1`: every save deletes the previous checkpoint, on
the prune thread, while the next write runs) or off (`keep_last` above the number of saves).

Prints the median write time (staged -> durable), prune time and save stall per case.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resctl.checkpoint.engine import Checkpointer  # noqa: E402
from resctl.telemetry.events import EventLog, read_events  # noqa: E402


def fill(kind: str, seconds: float, work: torch.Tensor) -> None:
    """Spend `seconds` idle (sleep) or computing (matmuls on `work`'s device)."""
    if seconds <= 0:
        return
    if kind == "sleep":
        time.sleep(seconds)
        return
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        work @ work
        if work.is_cuda:
            torch.cuda.synchronize()


def one_case(state: dict[str, Any], args: argparse.Namespace, gap: float, kind: str, keep: int,
             work: torch.Tensor) -> dict[str, Any]:
    ckpt_dir = Path(args.dir) / "ckpt"
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    run = Path(tempfile.mkdtemp(dir=args.dir))
    ck = Checkpointer(dir=ckpt_dir, interval_steps=1, async_=True, keep_last=keep, writers=args.writers,
                      events=EventLog(run, 0), rank=0, world_size=1)
    t0 = time.monotonic()
    for i in range(1, args.saves + 1):
        fill(kind, gap, work)
        ck.save(state, i)
    ck.wait()
    wall = time.monotonic() - t0
    ck.close()
    evs = list(read_events(run))
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    shutil.rmtree(run, ignore_errors=True)
    skip = 2  # the first saves also allocate the staging arena and warm the writers
    write = [e["seconds"] for e in evs if e["kind"] == "ckpt_persist"][skip:]
    stall = [e["seconds"] - e["waited"] for e in evs if e["kind"] == "ckpt_stall"][skip:]
    prune = [e["seconds"] for e in evs if e["kind"] == "ckpt_prune"][skip:]
    return {"gap_s": gap, "fill": kind, "keep_last": keep, "write_s": statistics.median(write),
            "write_min_s": min(write), "write_max_s": max(write), "stall_s": statistics.median(stall),
            "prune_s": statistics.median(prune) if prune else None, "per_save_s": wall / args.saves - gap}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--width", type=int, default=1536, help="model width as in examples/train_ckpt.py")
    ap.add_argument("--saves", type=int, default=20)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--gaps", type=float, nargs="+", default=[0.0, 0.3])
    ap.add_argument("--fills", nargs="+", default=["sleep", "compute"], choices=["sleep", "compute"])
    ap.add_argument("--dir", default="", help="where to write (default: a temp dir in the current directory)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.dir = args.dir or tempfile.mkdtemp(prefix="resctl-bench-spacing-", dir=".")
    dev = torch.device(args.device)
    model = nn.Sequential(nn.Linear(args.width, 2 * args.width), nn.Tanh(), nn.Linear(2 * args.width, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, args.width, device=dev)).sum().backward()
    opt.step()
    state = {"model": model, "optim": opt}
    work = torch.randn(512, 512, device=dev)
    rows = []
    for kind in args.fills:
        for gap in args.gaps:
            if gap == 0 and kind != args.fills[0]:
                continue  # no gap: nothing to fill
            for keep in (1, args.saves + 10):
                rows.append(one_case(state, args, gap, kind, keep, work))
                r = rows[-1]
                print(f"gap {gap:5.2f} s {kind:>7}  keep_last {keep:>3}: write {r['write_s'] * 1e3:7.1f} ms "
                      f"(min {r['write_min_s'] * 1e3:.0f}, max {r['write_max_s'] * 1e3:.0f})  "
                      f"prune {(r['prune_s'] or 0) * 1e3:6.1f} ms  stall {r['stall_s'] * 1e3:6.1f} ms", flush=True)
    shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"command": " ".join(sys.argv), "device": args.device,
                                               "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
