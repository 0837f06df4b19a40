"""SIGTERM to the launcher in each phase of the workers: time to the job's end, and processes left (issue 32).

The same unmodified script (bench/scripts/stop_phases.py) under torchrun, `resctl run` (forked workers) and
`resctl run --set launch.worker_start=exec`, alternating, 2 CPU workers, default settings (term timeout 60 s
for resctl; torchrun's 30 s). The signal goes to the launcher when the phase's marker appears: the
launcher's last log line before it forks (fork; refork: before the first restart's fork; resctl only, torchrun
logs nothing there by default), a file the script writes (import, init, restore, train).
Per run: seconds from the signal to the launcher's exit, its exit code, and the job's processes still alive
1 s later (every process of a run carries its MARKS in its environment).

Usage: python bench/bench_stop_phases.py [--repeats 3] [--phases import,init] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.jobs import stop_phase_reached

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "scripts" / "stop_phases.py"
PHASES = ("fork", "refork", "import", "init", "restore", "train")
LAUNCHERS = ("torchrun", "fork", "exec")


def _ours(token: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if token.encode() in fh.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def one(tmp: Path, phase: str, launcher: str, port: int) -> dict:
    work = tmp / f"{phase}-{launcher}-{time.monotonic_ns()}"  # its own checkpoints (cwd: torchrun's script)
    marks, run_dir = work / "marks", work / "run"
    marks.mkdir(parents=True)
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "3",
               "--master-port", str(port), str(SCRIPT)]
    else:
        cmd = [sys.executable, "-m", "resctl", "run", "--nproc-per-node", "2", "--run-dir", str(run_dir),
               "--set", f"launch.worker_start={launcher}", "--set", f"checkpoint.dir={work / 'checkpoints'}", str(SCRIPT)]
    env = {**os.environ, "MARKS": str(marks), "PHASE": phase, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while not stop_phase_reached(phase, marks, run_dir) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if proc.poll() is not None or time.monotonic() >= deadline:
        proc.kill()
        return {"phase": phase, "launcher": launcher, "error": "phase not reached"}
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = proc.wait()
    took = time.monotonic() - signalled
    time.sleep(1.0)
    left = _ours(str(marks))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return {"phase": phase, "launcher": launcher, "seconds": round(took, 3), "exit": code, "left": len(left)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="resctl-stop-phases-") as d:
        port = 29700 + os.getpid() % 200
        for _ in range(a.repeats):
            for phase in a.phases.split(","):
                for launcher in LAUNCHERS:
                    if launcher == "torchrun" and phase in ("fork", "refork"):
                        continue  # torchrun logs no line before it forks: no marker to send the signal at
                    rows.append(one(Path(d), phase, launcher, port))
                    print(json.dumps(rows[-1]), flush=True)
    summary = {}
    for phase in a.phases.split(","):
        for launcher in LAUNCHERS:
            mine = [r for r in rows if r["phase"] == phase and r["launcher"] == launcher and "seconds" in r]
            if mine:
                summary[f"{phase}/{launcher}"] = {"median_s": statistics.median(r["seconds"] for r in mine),
                                                  "max_s": max(r["seconds"] for r in mine),
                                                  "exits": sorted({r["exit"] for r in mine}),
                                                  "left": sum(r["left"] for r in mine), "runs": len(mine)}
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
