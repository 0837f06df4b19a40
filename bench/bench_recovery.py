"""Recovery time from the events log: in-process restart vs ft_launcher in-job restart.

Runs examples/train_ckpt.py under `resctl run` (4 CPU ranks, gloo, launcher monitor interval
0.5 s) with a schedule of injected faults — `exception` for in-process restart, `sigkill` for the
launcher's in-job restart — and measures, per fault, from the fault event's `t` to the first
`step` event after the resume. The breakdown per fault (medians are printed):

- detect+restart: fault -> `restart` event (in-process) / new cycle's `start` event (in-job)
- init:           restart/start -> `resume` event minus the checkpoint load (re-run or re-import
                  of the script, torch import for a fresh interpreter, init_process_group)
- load:           checkpoint load (the `resume` event's load_seconds)
- first step:     `resume` -> first `step` event

Usage: python bench/bench_recovery.py [--faults 11] [--nproc 4] [--mode both|inprocess|injob]
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from resctl.telemetry.events import read_events

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "examples" / "profiles" / "local-cpu.toml"
IN_PROCESS = [
    "inprocess.enabled=true", "inprocess.soft_timeout=5s", "inprocess.hard_timeout=8s",
    "inprocess.barrier_timeout=15s", "inprocess.heartbeat_timeout=10s", "inprocess.monitor_interval=0.5s",
    "inprocess.progress_interval=0.5s", "inprocess.last_call_wait=0.1s", "inprocess.termination_grace_time=1s",
]


def load_events(run_dir: Path) -> list[dict[str, Any]]:
    return sorted(read_events(run_dir), key=lambda e: e["t"])


def breakdown(events: list[dict[str, Any]], layer: str) -> list[dict[str, float]]:
    """One record per injected fault: total and parts (seconds, slowest rank for each stage)."""
    faults = [e for e in events if e["kind"] == "fault" and e.get("injected")]
    rows = []
    for f in faults:
        key = (f["cycle"], f["iteration"])
        after = [e for e in events if e["t"] > f["t"] and (e["cycle"], e["iteration"]) > key]
        if layer == "inprocess":
            nxt = (f["cycle"], f["iteration"] + 1)
            restarted = [e for e in after if e["kind"] == "restart" and (e["cycle"], e["iteration"]) == nxt]
        else:
            nxt = (f["cycle"] + 1, 0)
            restarted = [e for e in after if e["kind"] == "start" and (e["cycle"], e["iteration"]) == nxt]
        resumed = [e for e in after if e["kind"] == "resume" and (e["cycle"], e["iteration"]) == nxt]
        stepped = [e for e in after if e["kind"] == "step" and (e["cycle"], e["iteration"]) == nxt]
        if not (restarted and resumed and stepped):
            continue
        t_restart = max(e["t"] for e in restarted)  # every rank restarted
        t_resume = max(e["t"] for e in resumed)
        load = max(e.get("load_seconds", 0.0) for e in resumed)
        t_step = min(e["t"] for e in stepped)  # the first step after the resume (all ranks take it together)
        rows.append({
            "total": t_step - f["t"],
            "detect_restart": t_restart - f["t"],
            "init": max(0.0, t_resume - t_restart - load),
            "load": load,
            "first_step": t_step - t_resume,
        })
    return rows


def run(mode: str, faults: int, nproc: int, workdir: Path, worker_start: str = "exec") -> dict[str, Any]:
    kind = "exception" if mode == "inprocess" else "sigkill"
    steps = 10 * faults + 10
    schedule = ",".join(f"{kind}@{10 * i + 7}:{i % nproc}" for i in range(1, faults + 1))
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir = workdir / mode
    sets = [f"checkpoint.dir={workdir / (mode + '-ckpt')}", "checkpoint.interval_steps=5",
            "launch.monitor_interval=0.5s", f"launch.max_restarts={faults + 2}", "heartbeat.timeout=20s",
            f'launch.worker_start="{worker_start}"',
            *(IN_PROCESS + [f"inprocess.min_world_size={nproc}"] if mode == "inprocess" else [])]
    cmd = [sys.executable, "-m", "resctl", "run", "-p", str(PROFILE), "--nproc-per-node", str(nproc),
           "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    cmd += [str(REPO / "examples" / "train_ckpt.py"), "--steps", str(steps), "--step-time", "0.02"]
    env = {**os.environ, "RESCTL_FAULTS": schedule, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode} run failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
    rows = breakdown(load_events(run_dir), mode)
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]} if rows else {}
    return {"mode": mode, "worker_start": worker_start, "fault": kind, "faults_measured": len(rows), "p50": med,
            "max_total": round(max(r["total"] for r in rows), 3) if rows else None,
            "totals": [round(r["total"], 3) for r in rows], "wall_s": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=11)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--mode", choices=["both", "inprocess", "injob"], default="both")
    ap.add_argument("--worker-start", choices=["exec", "fork", "both"], default="exec",
                    help="launch.worker_start for the runs; both measures in-job restart with each")
    args = ap.parse_args()
    modes = ["inprocess", "injob"] if args.mode == "both" else [args.mode]
    with tempfile.TemporaryDirectory(prefix="resctl-bench-recovery-") as tmp:
        starts = ["exec", "fork"] if args.worker_start == "both" else [args.worker_start]
        results = [run(m, args.faults, args.nproc, Path(tmp) / ws, ws) for ws in starts for m in modes
                   if not (m == "inprocess" and ws == "fork" and len(starts) > 1)]
    print(json.dumps({"nproc": args.nproc, "monitor_interval_s": 0.5, "cpus": os.cpu_count(),
                      "date": time.strftime("%Y-%m-%d"), "results": results}, indent=2))


if __name__ == "__main__":
    main()
