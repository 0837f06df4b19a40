"""kill -9 -> training again on the PyTorch DDP tutorial script, torchrun vs resctl, alternating (issue 31, item 4).

The script is pytorch/examples' `distributed/ddp-tutorial-series/multigpu_torchrun.py` (with its
`datautils.py`), unmodified and not part of this repository: pass the folder holding both. It
trains `--epochs` epochs, saves its own snapshot (torch.save) every `--save-every` epochs, and on a
restart prints "Loading snapshot", then "Resuming training from snapshot at Epoch N", then one
"[GPU<r>] Epoch <e> | ..." line per epoch. Each round starts the job in a fresh folder, waits for
"Epoch <kill-at> | Training snapshot saved", SIGKILLs the worker of local rank 0 and times, from
the kill, the arrival of each line (PYTHONUNBUFFERED=1 for both launchers):

- `loading`: the new worker reached the script's load: detect + stop + rendezvous + start + CUDA
  init + process group + the script's dataset;
- `resumed`: its torch.load and load_state_dict are done;
- `epoch`: the first epoch line after it (DDP's wrap and the DataLoader's first batch): training again.

For resctl the run's own report (`resctl report --json`) adds the launcher's phases (detect, stop,
rendezvous, start workers, restore, first step).

    python bench/bench_tutorial_kill.py --examples DIR --nproc 1 --rounds 3 [--resctl-args "..."]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_kill_resume import Job

SCRIPT = "multigpu_torchrun.py"


def worker_pid(launcher: str, job: Job, run_dir: Path) -> int:
    """Local rank 0's worker: from the run's `start` events (resctl), else the launcher's child
    running the script (torchrun)."""
    if launcher == "resctl":
        starts = [json.loads(line) for line in (run_dir / "events-rank0.jsonl").read_text().splitlines()
                  if '"kind":"start"' in line.replace(" ", "")]
        return int(starts[-1]["pid"])
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == job.proc.pid and any(part.endswith(SCRIPT.encode()) for part in cmd):
            return pid
    raise RuntimeError("torchrun's worker not found")


def one_round(launcher: str, a: argparse.Namespace, tmp: Path, env: dict[str, str]) -> dict[str, Any]:
    for name in (SCRIPT, "datautils.py"):
        shutil.copy(a.examples / name, tmp / name)
    run_dir = tmp / "run"
    common = ["--nproc-per-node", str(a.nproc), "--max-restarts", "3"]
    if launcher == "torchrun":
        argv = [sys.executable, "-m", "torch.distributed.run", *common]
    else:
        argv = [sys.executable, "-m", "resctl", "run", *common, "--run-dir", str(run_dir), *a.resctl_args]
    job = Job([*argv, SCRIPT, str(a.epochs), str(a.save_every)], tmp, env)
    try:
        i, _ = job.wait_line(lambda line: f"Epoch {a.kill_at} | Training snapshot saved" in line, a.timeout)
        os.kill(worker_pid(launcher, job, run_dir), signal.SIGKILL)
        t_kill = time.time()
        times = {}
        for key, pred in (("loading", lambda line: "Loading snapshot" in line),
                          ("resumed", lambda line: "Resuming training from snapshot" in line),
                          ("epoch", lambda line: "[GPU0] Epoch" in line)):
            i, _ = job.wait_line(pred, a.timeout, i + 1)
            times[key] = round(job.arrival[i] - t_kill, 3)
        out: dict[str, Any] = {"kill_to": times}
        if launcher == "resctl":
            time.sleep(2.0)  # the first step events after the resume reach the file (batched)
            rep = subprocess.run([sys.executable, "-m", "resctl", "report", "--json", str(run_dir)], capture_output=True,
                                 text=True, timeout=60)
            recs = json.loads(rep.stdout).get("recoveries", []) if rep.returncode == 0 else []
            out["report"] = recs[0] if recs else rep.stderr[-500:]
            if a.keep is not None:  # the launcher's log and the events, to read the restart's timeline
                dest = a.keep / f"resctl-{time.time_ns()}"
                shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("*.pt", "checkpoints"))
        return out
    finally:
        job.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=Path, required=True, help="folder with multigpu_torchrun.py and datautils.py")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=200)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--kill-at", type=int, default=100)
    ap.add_argument("--launchers", default="torchrun,resctl")
    ap.add_argument("--resctl-args", default="")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--keep", type=Path, help="copy each resctl run directory (logs, events) here")
    a = ap.parse_args()
    a.resctl_args = a.resctl_args.split()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    launchers = a.launchers.split(",")
    result: dict[str, Any] = {"rounds": {k: [] for k in launchers}}
    for _ in range(a.rounds):
        for launcher in launchers:
            with tempfile.TemporaryDirectory(prefix=f"tutorial-{launcher}-") as d:
                try:
                    got = one_round(launcher, a, Path(d), env)
                    result["rounds"][launcher].append(got)
                    print(f"{launcher} {json.dumps(got['kill_to'])}", file=sys.stderr, flush=True)
                except Exception:  # noqa: BLE001 - a failed round is reported, the others still count
                    result.setdefault("errors", []).append(f"{launcher}: {traceback.format_exc()}"[-3000:])
    result["p50"] = {k: {key: statistics.median(r["kill_to"][key] for r in v) for key in ("loading", "resumed", "epoch")}
                     for k, v in result["rounds"].items() if v}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
