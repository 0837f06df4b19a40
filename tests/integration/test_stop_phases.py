"""Every stop ends within seconds, whatever the workers are doing (issue 32): SIGTERM to `resctl run` while the
workers are being forked (the first cycle's or a restart's), importing, in init_process_group, restoring or training; forked and exec'd workers.
The signal is sent when the phase's marker appears (a file the script writes, or resctl's launcher.log line
before it forks), not after a clock. Asserted: every worker ends well within the 60 s
`launch.term_timeout` (the bound a worker that outlived the signal used to hit), the job ends with 143, and no
process of the job is left. bench/bench_stop_phases.py measures the exact times."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.jobs import finish, start, stop_phase_reached, wait_for

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "scripts" / "stop_phases.py"  # what each phase does

PHASES = ("fork", "refork", "import", "init", "restore", "train")
BOUND = 20.0  # s from the signal to the last worker's end: << launch.term_timeout (60 s), what a stuck worker waited


def _ours(token: str) -> list[int]:
    """Processes of this job: every descendant of `resctl run` carries MARKS in its environment."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if token.encode() in fh.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _worker_pids(marks: Path) -> list[int]:
    """The workers started so far (each writes `pid-<rank>-<pid>` first; in a fork phase, maybe none yet)."""
    return [int(p.name.rsplit("-", 1)[1]) for p in marks.iterdir() if p.name.startswith("pid-")]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except OSError:
        return False


@pytest.mark.parametrize("worker_start", ["fork", "exec"])
@pytest.mark.parametrize("phase", PHASES)
def test_a_sigterm_in_any_phase_ends_every_worker_within_seconds(tmp_path: Path, phase: str, worker_start: str) -> None:
    marks, run_dir = tmp_path / "marks", tmp_path / "run"
    marks.mkdir()
    script = tmp_path / "phases.py"
    script.write_text(SCRIPT.read_text())
    args = ["--nproc-per-node", "2", "--run-dir", str(run_dir), "--set", f"launch.worker_start={worker_start}",
            "--set", f"checkpoint.dir={tmp_path / 'ckpt'}", "--set", "checkpoint.interval_steps=1", str(script)]
    proc = start(args, cwd=tmp_path, env={"MARKS": str(marks), "PHASE": phase})
    try:
        wait_for(lambda: stop_phase_reached(phase, marks, run_dir), 180, f"phase {phase}", proc)
        workers = _worker_pids(marks)
        signalled = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        while (alive := [p for p in workers if _alive(p)]) and time.monotonic() - signalled < 120:
            time.sleep(0.02)
        took = time.monotonic() - signalled  # every worker of the cycle gone (the launcher's own exit: after)
        code, out = finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 143, out[-3000:]
    assert not alive and took < BOUND, \
        f"{phase}/{worker_start}: workers {alive} took {took:.1f} s to end after SIGTERM:\n{out[-3000:]}"
    assert "forcefully exiting via 9" not in (run_dir / "launcher.log").read_text(errors="replace")
    deadline = time.monotonic() + 10  # orphans of the launcher are reaped by init, not by us
    while (left := _ours(str(marks))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"{phase}/{worker_start}: processes left after the job ended: {left}"
    print(f"{phase}/{worker_start}: ended {took:.2f} s after SIGTERM")
