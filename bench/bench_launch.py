"""How much resctl adds in front of ft_launcher, measured side by side in one run.

- `resctl --help` wall time (target < 0.3 s);
- time from starting the command to the first line a worker prints, `resctl run` vs. the same job
  under bare `ft_launcher` (target: resctl adds < 0.5 s). Runs alternate, so machine noise hits both.

    python bench/bench_launch.py --repeats 7
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

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "first_line.py")


def time_help() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "resctl", "--help"], check=True, capture_output=True)
    return time.perf_counter() - t0


def time_first_line(cmd: list[str], cwd: str) -> float:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "WORKER-UP" in line:
            elapsed = time.perf_counter() - t0
            break
    else:
        raise RuntimeError(f"no worker line from {cmd}")
    proc.wait(timeout=120)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    common = ["--nnodes", "1", "--nproc-per-node", "1", "--rdzv-endpoint", "127.0.0.1:0", "--monitor-interval", "0.1"]
    bare = [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", *common,
            "--ft-rank-heartbeat-timeout", "900", "--ft-initial-rank-heartbeat-timeout", "1200", WORKER]
    resctl = [sys.executable, "-m", "resctl", "run", "--set", "launch.monitor_interval=100ms", *common[:4], WORKER]
    helps, t_bare, t_resctl = [], [], []
    with tempfile.TemporaryDirectory() as cwd:
        time_first_line(bare, cwd)  # warm the page cache for both
        for _ in range(args.repeats):
            helps.append(time_help())
            t_bare.append(time_first_line(bare + [], cwd))
            t_resctl.append(time_first_line(resctl, cwd))
    med = statistics.median
    print(json.dumps({
        "repeats": args.repeats,
        "help_s_median": round(med(helps), 3),
        "first_worker_line_s_median": {"ft_launcher": round(med(t_bare), 3), "resctl_run": round(med(t_resctl), 3)},
        "resctl_adds_s_median": round(med(r - b for r, b in zip(t_resctl, t_bare)), 3),
        "raw": {"help": [round(x, 3) for x in helps], "ft_launcher": [round(x, 3) for x in t_bare],
                "resctl_run": [round(x, 3) for x in t_resctl]},
    }, indent=2))


if __name__ == "__main__":
    main()
