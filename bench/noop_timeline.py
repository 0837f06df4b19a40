"""Where a no-op job's seconds go under `resctl run` beside torchrun (issue 43, item 2), one machine, alternating.

Each round runs bench/scripts/happy_noop.py under torchrun and `resctl run` (1 worker); for resctl it then lays
the run's own clocks on the wall clock from the command's start: the launcher log's lines (ms timestamps) and the
events files' `t`, and prints that timeline for the last round. With `--importtime`, the `resctl run` process's
own imports (`python -X importtime`), top 15 by cumulative time. With `--trace`, one more round of each launcher
with bench/start_trace/ on PYTHONPATH: every Python process of the job (CLI, launcher, workers) logs its start, its
first import of a few heavy packages, the shared libraries it loads through ctypes (and who loaded them), its forks
and spawns and its exit, merged into one timeline from the command's start.

    python bench/noop_timeline.py --rounds 3 [--importtime] [--trace]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOOP = HERE / "scripts" / "happy_noop.py"
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] (.*)$")


def run(cmd: list[str], cwd: Path) -> tuple[float, float]:
    """(epoch at start, wall seconds)."""
    t0, m0 = time.time(), time.monotonic()
    subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)
    return t0, time.monotonic() - m0


def timeline(run_dir: Path, t0: float) -> list[tuple[float, str]]:
    rows = []
    for line in (run_dir / "launcher.log").read_text(errors="replace").splitlines():
        m = STAMP.match(line)
        if m:
            at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            rows.append((at - t0, "launcher: " + m.group(2)[:150]))
    for events in sorted(run_dir.glob("events*.jsonl")):
        for line in events.read_text(errors="replace").splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if isinstance(e, dict) and isinstance(e.get("t"), (int, float)):
                rows.append((e["t"] - t0, f"{events.name}: {e.get('kind')} " + json.dumps(
                    {k: v for k, v in e.items() if k not in ("t", "kind")})[:140]))
    return sorted(rows)


def traced(cmd: list[str], cwd: Path, label: str) -> None:
    """One more run of `cmd` under bench/start_trace/sitecustomize.py, its processes' trace printed as one timeline."""
    trace = cwd / f"trace-{label}.txt"
    env = {**os.environ, "RESCTL_START_TRACE": str(trace),
           "PYTHONPATH": os.pathsep.join(p for p in (str(HERE / "start_trace"), os.environ.get("PYTHONPATH", "")) if p)}
    t0, m0 = time.time(), time.monotonic()
    subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120, check=False)
    print(f"{label}, traced ({time.monotonic() - m0:.3f} s), seconds from the command's start:")
    rows = sorted((float(line.split(" ", 1)[0]), line.split(" ", 1)[1]) for line in trace.read_text().splitlines() if line)
    for at, what in rows:
        print(f"  {at - t0:7.3f}  {what[:260]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--importtime", action="store_true")
    ap.add_argument("--trace", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="noop-timeline-"))
    walls: dict[str, list[float]] = {"torchrun": [], "resctl": []}
    last = None
    for i in range(a.rounds):
        for kind in (("torchrun", "resctl") if i % 2 == 0 else ("resctl", "torchrun")):
            if kind == "torchrun":
                _, wall = run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(NOOP)], tmp)
            else:
                run_dir = tmp / f"run-{i}"
                t0, wall = run([sys.executable, "-m", "resctl", "run", "--nproc-per-node", "1", "--run-dir", str(run_dir),
                                str(NOOP)], tmp)
                last = (run_dir, t0, wall)
            walls[kind].append(wall)
    for kind, ws in walls.items():
        print(f"{kind}: no-op wall median {statistics.median(ws):.3f} s ({', '.join(f'{w:.3f}' for w in ws)})")
    if last is not None:
        run_dir, t0, wall = last
        print(f"resctl's last round ({wall:.3f} s), seconds from the command's start:")
        for at, what in timeline(run_dir, t0):
            print(f"  {at:7.3f}  {what}")
    if a.trace:
        traced([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(NOOP)], tmp, "torchrun")
        traced([sys.executable, "-m", "resctl", "run", "--nproc-per-node", "1", "--run-dir", str(tmp / "traced"),
                str(NOOP)], tmp, "resctl")
    if a.importtime:
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "resctl", "run", "--nproc-per-node", "1",
                               "--run-dir", str(tmp / "imports"), str(NOOP)], cwd=tmp, capture_output=True, text=True,
                              timeout=120, check=False)
        rows = [line.split("|") for line in proc.stderr.splitlines() if line.startswith("import time:")]
        top = sorted(((int(r[1]), r[2].rstrip()) for r in rows if len(r) == 3 and r[1].strip().isdigit()), reverse=True)
        print("resctl run's own imports, top 15 by cumulative us:")
        for us, name in top[:15]:
            print(f"  {us:9d}  {name}")


if __name__ == "__main__":
    main()
