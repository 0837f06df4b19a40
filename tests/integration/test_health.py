"""Health that acts, end to end (real ft_launcher, real workers): restarts without progress stop the job
with exit 93; a rank slower than the others is named once (console, event, report)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.integration.jobs import LOCAL_PROFILE, events, finish, start

pytestmark = pytest.mark.slow

# Crashes before its first optimizer step, every cycle: what no restart cures.
CRASH_AT_START = "raise RuntimeError('bad config: crashes before the first step')\n"

# Each rank steps on its own (no collective per step); rank 1 slows down from step 15 on.
UNEVEN = textwrap.dedent("""
    import os, time, torch
    rank = int(os.environ["RANK"])
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, 61):
        time.sleep(0.06 if rank == 1 and step >= 15 else 0.02)
        opt.step()
""")


def _script(tmp: Path, name: str, text: str) -> str:
    path = tmp / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("nproc", [2, 1], ids=["2ranks", "1rank-forked"])
def test_restarts_that_make_no_progress_stop_the_job_with_exit_93(tmp_path: Path, nproc: int) -> None:
    """One forked worker too: NVRx asks its last process context whether a rank failed, and the gate's stop
    comes between cycles, where one forked worker's failure had been reported once already (exit 0 before)."""
    run_dir = tmp_path / "run"
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", str(nproc), "--run-dir", str(run_dir),
            "--set", "launch.max_restarts=6", "--set", "health.no_progress_cycles=2", "--set", "launch.worker_start=fork",
            "--set", f"checkpoint.dir={tmp_path / 'ckpt'}", _script(tmp_path, "crash.py", CRASH_AT_START)]
    began = time.monotonic()
    code, out = finish(start(args, cwd=tmp_path), timeout=120)
    took = time.monotonic() - began
    assert code == 93, out[-3000:]
    assert "no progress in 2 launcher cycle(s)" in out and "stopped the job" in out, out[-3000:]
    cycles = {e["cycle"] for e in events(run_dir) if e["kind"] == "start"}
    assert cycles == {0, 1}, f"no cycle beyond the limit starts: cycles {sorted(cycles)}"
    launcher_log = (run_dir / "launcher.log").read_text(errors="replace")
    assert "forcefully exiting via 9" not in launcher_log, "a worker outlived the stop until its term timeout"
    fatal = json.loads((run_dir / "fatal.json").read_text())
    assert fatal["cause"] == "no_progress" and fatal["exit_code"] == 93
    print(f"no-progress stop: exit 93 after cycles {sorted(cycles)} in {took:.1f} s")


def test_a_slow_rank_is_named_once_on_the_console_in_events_and_in_the_report(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "3", "--run-dir", str(run_dir),
            "--set", "health.straggler_steps=8", "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
            _script(tmp_path, "uneven.py", UNEVEN)]
    code, out = finish(start(args, cwd=tmp_path), timeout=120)
    assert code == 0, out[-3000:]
    assert out.count("is a straggler") == 1 and "rank 1 is a straggler" in out, out[-3000:]
    evs = events(run_dir)
    named = [e for e in evs if e["kind"] == "straggler"]
    assert [e["rank"] for e in named] == [1] and named[0]["ratio"] > 1.5, named
    slow_from = min(e["t"] for e in evs if e["kind"] == "step" and e["rank"] == 1 and e["step"] >= 15)
    delay = named[0]["t"] - slow_from
    report = subprocess.run([sys.executable, "-m", "resctl", "report", str(run_dir)], capture_output=True,
                            text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert "straggler" in report.stdout + report.stderr, report.stdout
    print(f"straggler named {delay:.2f} s after its first slow step (step {named[0]['step']})")
