"""Health that acts, timed on this box: straggler detection delay and the no-progress stop.

- straggler: 4 CPU ranks step on their own (no per-step collective); rank 1's step goes from
  `--step` to 3x at step 30. Delay = the `straggler` event's `t` - the `t` of rank 1's first slow step
  (defaults: health.straggler_margin 0.5, health.straggler_steps 20).
- no-progress: 2 ranks whose script raises before its first step, `health.no_progress_cycles = 2`,
  `launch.max_restarts = 10`: wall time of `resctl run` to its exit 93, and the cycles it spent.

Usage: python bench/bench_health.py [--runs 3] [--step 0.05]   (prints one JSON object)
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

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "examples" / "profiles" / "local-cpu.toml"
UNEVEN = textwrap.dedent("""
    import os, sys, time, torch
    rank, base = int(os.environ["RANK"]), float(sys.argv[1])
    opt = torch.optim.SGD(torch.nn.Linear(4, 4).parameters(), lr=0.1)
    for step in range(1, 101):
        time.sleep(base * 3 if rank == 1 and step >= 30 else base)
        opt.step()
""")


def _run(args: list[str], cwd: Path) -> tuple[int, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "resctl", "run", "-p", str(PROFILE), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, time.monotonic() - began


def straggler(tmp: Path, step: float) -> dict[str, float]:
    script = tmp / "uneven.py"
    script.write_text(UNEVEN)
    run_dir = tmp / "straggler"
    code, _ = _run(["--nproc-per-node", "4", "--run-dir", str(run_dir), "--set", f"checkpoint.dir={tmp / 'ck'}",
                    str(script), str(step)], tmp)
    events = sorted(read_events(run_dir), key=lambda e: e["t"])
    named = [e for e in events if e["kind"] == "straggler"]
    slow = min(e["t"] for e in events if e["kind"] == "step" and e["rank"] == 1 and e["step"] >= 30)
    assert code == 0 and [e["rank"] for e in named] == [1], (code, named)
    return {"delay_s": named[0]["t"] - slow, "delay_steps": named[0]["step"] - 29}


def no_progress(tmp: Path) -> dict[str, float]:
    script = tmp / "crash.py"
    script.write_text("raise RuntimeError('crashes before its first step')\n")
    run_dir = tmp / "noprog"
    code, wall = _run(["--nproc-per-node", "2", "--run-dir", str(run_dir), "--set", "health.no_progress_cycles=2",
                       "--set", "launch.max_restarts=10", "--set", f"checkpoint.dir={tmp / 'ck2'}", str(script)], tmp)
    cycles = {e["cycle"] for e in read_events(run_dir) if e["kind"] == "start"}
    assert code == 93, code
    return {"wall_s": wall, "cycles": len(cycles)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--step", type=float, default=0.05)
    a = parser.parse_args()
    delays, stops = [], []
    for _ in range(a.runs):
        with tempfile.TemporaryDirectory() as d:
            delays.append(straggler(Path(d), a.step))
            stops.append(no_progress(Path(d)))
    print(json.dumps({
        "straggler_delay_s_p50": statistics.median(d["delay_s"] for d in delays),
        "straggler_delay_s": [round(d["delay_s"], 3) for d in delays],
        "straggler_delay_steps": [d["delay_steps"] for d in delays],
        "no_progress_wall_s_p50": statistics.median(s["wall_s"] for s in stops),
        "no_progress_cycles": [s["cycles"] for s in stops],
    }, indent=2))


if __name__ == "__main__":
    main()
