"""A job stop that lands while the launcher restarts workers is never lost (issue 27, item 3).

Each trial: a 2-rank CPU job (examples/train_ckpt.py, real ft_launcher), rank 1 is SIGKILLed at
step 10, and `resctl run` (or the launcher) gets SIGTERM `delay` seconds later, delay uniform in
[0.15, 0.8] s: the window in which NVRx 0.4.1 swallowed it. A trial passes when the job exits 143
before training ends, with a final checkpoint at (or past) the newest step every rank reached.

    python bench/bench_sigterm_restart.py --trials 18 [--target launcher] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resctl.checkpoint import format as fmt
from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, last_step, start, wait_for, worker_pid

STEPS = 300


def args_for(tmp: Path, name: str, worker_start: str) -> list[str]:
    sets = [f"checkpoint.dir={tmp / (name + '-ckpt')}", "checkpoint.interval_steps=5",
            "checkpoint.save_on_sigterm=true", "checkpoint.sigterm_grace=8s", "launch.term_timeout=10s",
            "heartbeat.timeout=20s", "launch.max_restarts=3", f"launch.worker_start={worker_start}"]
    out = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp / name)]
    for s in sets:
        out += ["--set", s]
    return [*out, str(EXAMPLES / "train_ckpt.py"), "--steps", str(STEPS), "--step-time", "0.05"]


def launcher_pid(resctl_pid: int) -> int:
    import psutil

    kids = psutil.Process(resctl_pid).children()
    return kids[0].pid


def trial(tmp: Path, name: str, delay: float, target: str, worker_start: str) -> dict[str, object]:
    run_dir = tmp / name
    proc = start(args_for(tmp, name, worker_start), cwd=tmp)
    wait_for(lambda: last_step(run_dir, 1) >= 10, 120, "step 10", proc)
    victim = worker_pid(run_dir, 1)
    assert victim
    os.kill(victim, signal.SIGKILL)
    time.sleep(delay)
    os.kill(launcher_pid(proc.pid) if target == "launcher" else proc.pid, signal.SIGTERM)
    code, out = finish(proc, timeout=120)
    saved = [s for s, p in fmt.list_step_dirs(tmp / (name + "-ckpt")) if (p / fmt.MANIFEST).exists()]
    final = max(saved, default=0)
    ev = events(run_dir)
    cycle = max(e["cycle"] for e in ev)
    # The newest step every rank reached in the last cycle (a stop handed to new workers ends them
    # right after their load, at the step they resumed from).
    reached = [max((e["step"] for e in ev if e["rank"] == r and e["cycle"] == cycle and e["kind"] in ("step", "resume")),
                   default=0) for r in (0, 1)]
    stopped_at = min(reached)
    # Nothing every rank had is lost, and training did not go on to the end. A stop that came before
    # the restart (one cycle) lost only what the killed rank had not saved: the kill's loss.
    ok = code == 143 and (final >= stopped_at or cycle == 0) and max(reached) < STEPS
    return {"delay": round(delay, 3), "exit": code, "final_save": final, "stopped_at": stopped_at, "cycles": cycle + 1, "ok": ok}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=18)
    ap.add_argument("--target", choices=("resctl", "launcher"), default="resctl")
    ap.add_argument("--worker-start", choices=("fork", "exec"), default="fork")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    results = []
    with tempfile.TemporaryDirectory(prefix="resctl-bench-term-") as d:
        for i in range(a.trials):
            r = trial(Path(d), f"t{i}", rng.uniform(0.15, 0.8), a.target, a.worker_start)
            print(json.dumps(r), flush=True)
            results.append(r)
    print(f"{sum(bool(r['ok']) for r in results)}/{len(results)} trials stopped with exit 143 and a final save")


if __name__ == "__main__":
    main()
