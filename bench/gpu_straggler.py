"""A slow rank in a synchronous job named by its own work outside the collectives it waits in (issues 32, 41),
on CPU or GPUs.

Ranks train a DDP, FSDP2 (`fully_shard` on each layer and the model) or FSDP1 model (`--model`) under
`resctl run` (`--device cuda --backend gloo`: both ranks on GPU 0 over gloo, which reduces CUDA tensors for DDP;
NCCL refuses two ranks on one GPU; `--backend nccl` puts rank r on GPU r, for a host with a GPU per rank).
Cases, alternating, `--runs` each:
- slow: rank 1 does `--delay` s more a step from step `--slow-from`, `--where` in the step: before the forward
  (a slow data loader) or after the backward, before the optimizer step (clipping, metrics, logging on a slow
  host). `--kind host`: a host stall; the GPU sees it as a gap in the rank's stream. `--kind gpu`: extra
  matmuls on the GPU; on one shared GPU the two processes' kernels are time-sliced, so this slows rank 0's
  stream too: read its numbers with that in mind);
- even: no rank slowed.
Per run: the ranks named (console `is a straggler` lines and `straggler` events, with `measure`), the
detection delay (the event's `t` - the `t` of rank 1's first slow step), each rank's median step time and
median own work (`busy`: CUDA events on a GPU). Verdict: slow runs name rank 1 by `busy`, even runs no one.

Usage: python bench/gpu_straggler.py --device cuda [--runs 3] [--kind host|gpu] [--model ddp|fsdp2|fsdp1]
           [--where before|after] [--backend gloo|nccl --nproc N] [--json OUT]
       python bench/gpu_straggler.py --device cpu --runs 1 --model fsdp2   (the same on this box)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resctl.telemetry.events import read_events

SCRIPT = textwrap.dedent("""
    import os, sys, time, torch, torch.distributed as dist
    device, kind, delay, slow_from, steps = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    model_kind, where, backend = sys.argv[6], sys.argv[7], sys.argv[8]
    if device == "cuda" and backend == "nccl":
        device = f"cuda:{int(os.environ['LOCAL_RANK']) % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    dist.init_process_group(backend)
    rank, slow = int(os.environ["RANK"]), int(os.environ.get("SLOW_RANK", "-1"))
    width = 2048 if device.startswith("cuda") else 128
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width).to(device) for _ in range(4)]
    model = torch.nn.Sequential(*layers)
    if model_kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model)
    elif model_kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        model = FSDP(model, device_id=torch.device(device))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(64, width, device=device)
    burn = torch.randn(4096, 4096, device=device) if kind == "gpu" and device.startswith("cuda") else None
    per_matmul = None

    def stall():
        global per_matmul
        if burn is None:
            time.sleep(delay)
            return
        if per_matmul is None:  # calibrate once: matmuls worth `delay` of GPU time
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); burn @ burn; b.record(); b.synchronize()
            per_matmul = max(a.elapsed_time(b) / 1000, 1e-4)
        for _ in range(max(1, round(delay / per_matmul))):
            burn @ burn

    for step in range(1, steps + 1):
        slow_now = rank == slow and step >= slow_from
        if slow_now and where == "before":
            stall()
        model(x).sum().backward()
        if slow_now and where == "after":
            stall()
        opt.step()
        opt.zero_grad()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
""")


def one(tmp: Path, case: str, a: argparse.Namespace) -> dict:
    script = tmp / "sync_straggler.py"
    script.write_text(SCRIPT)
    run_dir = tmp / f"{case}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "resctl", "run", "--nproc-per-node", str(a.nproc), "--run-dir", str(run_dir),
           "--set", f"checkpoint.dir={tmp / 'ckpt'}", str(script), a.device, a.kind, str(a.delay), str(a.slow_from),
           str(a.steps), a.model, a.where, a.backend]
    env = {**os.environ, "SLOW_RANK": "1" if case == "slow" else "-1", "OMP_NUM_THREADS": "1"}
    began = time.monotonic()
    done = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - began
    evs = sorted(read_events(run_dir), key=lambda e: e["t"])
    named = [e for e in evs if e["kind"] == "straggler"]
    steps = [e for e in evs if e["kind"] == "step"]
    first_slow = min((e["t"] for e in steps if e["rank"] == 1 and e["step"] >= a.slow_from), default=None)
    per_rank = {}
    for rank in range(a.nproc):
        mine = [e for e in steps if e["rank"] == rank and e["step"] >= a.slow_from + 5]
        busy = [e["busy"] for e in mine if e.get("busy") is not None]
        per_rank[rank] = {"step_s": statistics.median(e["duration"] for e in mine) if mine else None,
                          "busy_s": statistics.median(busy) if busy else None, "busy_steps": len(busy)}
    return {"case": case, "exit": done.returncode, "wall_s": round(wall, 2),
            "console": [line for line in done.stdout.splitlines() + done.stderr.splitlines() if "is a straggler" in line],
            "named": [{"rank": e["rank"], "measure": e.get("measure"), "step": e["step"], "ratio": e["ratio"]} for e in named],
            "delay_s": round(named[0]["t"] - first_slow, 2) if named and first_slow else None,
            "ranks": per_rank, "stderr_tail": done.stderr[-1500:] if done.returncode else ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--kind", choices=["host", "gpu"], default="host")
    p.add_argument("--delay", type=float, default=0.04)
    p.add_argument("--slow-from", type=int, default=30)
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--model", choices=["ddp", "fsdp2", "fsdp1"], default="ddp")
    p.add_argument("--where", choices=["before", "after"], default="before")
    p.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="resctl-straggler-") as tmp:
        for _ in range(a.runs):
            for case in ("slow", "even"):
                results.append(one(Path(tmp), case, a))
                print(json.dumps(results[-1]), flush=True)
    ok = all(r["exit"] == 0 for r in results) \
        and all([(n["rank"], n["measure"]) for n in r["named"]] == [(1, "busy")] for r in results if r["case"] == "slow") \
        and all(not r["named"] for r in results if r["case"] == "even")
    delays = [r["delay_s"] for r in results if r["delay_s"] is not None]
    summary = {"device": a.device, "kind": a.kind, "model": a.model, "where": a.where, "backend": a.backend,
               "nproc": a.nproc, "delay": a.delay, "runs": a.runs, "verdict": "PASS" if ok else "FAIL",
               "detection_delay_s_median": statistics.median(delays) if delays else None}
    print(json.dumps(summary))
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
