"""The stop step (resctl/shim/stopstep.py): SIGTERM that reaches the ranks at different steps still
ends with one final checkpoint at one step, on every rank.

Two real worker processes (`python -m resctl.shim examples/train_ckpt.py`, gloo on CPU, rank 0 hosting
the TCPStore as `init_process_group()` does without a launcher), no launcher, so each worker's exit
code is seen as it is. `--sigterm-at STEP:RANK@SECONDS` makes a rank signal itself after the step's
all-reduce, SECONDS later: `20:1@0.5` is the race of issue 16, where rank 0 has passed the step-20
boundary and waits in step 21's all-reduce while rank 1 is still before the boundary of step 20.
Without the agreement rank 1 saved at 20 (rank 0 writes the replicated state, so nothing was
written) and left, and rank 0's all-reduce failed: no final checkpoint at all.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from resctl.checkpoint.format import list_step_dirs, read_manifest
from resctl.profile.schema import Profile
from tests.integration.jobs import EXAMPLES, events
from tests.ports import free_port

# nvrx_independent: no launcher and no NVRx: two shim workers and their TCPStore (in-process restart off, no rank
# monitor socket), so the agreement is the same code on every NVRx; the launcher's SIGTERM path that reaches it runs on
# both versions in test_stop_phases and test_secrets (a SIGTERM'd job saves, then exits 143).
pytestmark = [pytest.mark.slow, pytest.mark.nvrx_independent]
SCRIPT = str(EXAMPLES / "train_ckpt.py")


def start_ranks(tmp: Path, script_args: list[str], grace: float = 20.0,
                faults: list[dict[str, Any]] | None = None) -> list[subprocess.Popen[str]]:
    run_dir = tmp / "run"
    run_dir.mkdir(parents=True)
    profile = Profile.model_validate({
        "checkpoint": {"dir": str(tmp / "ckpt"), "interval_steps": 1000, "sigterm_grace": grace, "async": True},
        "faults": {"schedule": faults or []},
    })
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"profile": profile.model_dump(mode="json"), "run_dir": str(run_dir)}))
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "RESCTL_PLAN": str(plan), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        env = {k: v for k, v in env.items() if not k.startswith(("RESCTL_", "TORCHELASTIC_")) or k == "RESCTL_PLAN"}
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "resctl.shim", SCRIPT, "--steps", "100000", "--step-time", "0.05", *script_args],
            cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
    return procs


def finish_all(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            raise AssertionError(f"rank {procs.index(proc)} did not exit within {timeout}s:\n{out[-3000:]}") from None
        results.append((proc.returncode, out))
    return results


def newest_checkpoint(ckpt: Path) -> int:
    for step, path in list_step_dirs(ckpt):
        read_manifest(path / "manifest.json")
        return step
    return 0


def ends(run_dir: Path) -> dict[int, dict[str, Any]]:
    return {e["rank"]: e for e in events(run_dir) if e["kind"] == "end"}


def stops(run_dir: Path) -> dict[int, dict[str, Any]]:
    return {e["rank"]: e for e in events(run_dir) if e["kind"] == "stop"}


def reached(run_dir: Path) -> int:
    return max(e["step"] for e in events(run_dir) if e["kind"] == "step")


@pytest.mark.parametrize("sigterm_at, expected", [
    ("20:1@0.5,21:0", 21),  # rank 0 past the step-20 boundary (in 21's all-reduce) when rank 1 is signalled
    ("20:0@0.5,21:1", 21),  # the same, the other way round
    ("20:1", None),  # one rank signalled: the other stops with it, told through the store
])
def test_ranks_signalled_at_different_steps_save_one_final_step(tmp_path: Path, sigterm_at: str,
                                                                expected: int | None) -> None:
    procs = start_ranks(tmp_path, ["--sigterm-at", sigterm_at])
    results = finish_all(procs, timeout=90)
    logs = "\n".join(out[-2000:] for _, out in results)
    assert [code for code, _ in results] == [143, 143], logs
    run_dir = tmp_path / "run"
    end = ends(run_dir)
    assert {r: e["status"] for r, e in end.items()} == {0: "sigterm", 1: "sigterm"}, logs
    final = end[0]["step"]
    assert end[1]["step"] == final
    if expected is not None:
        assert final == expected
    assert reached(run_dir) == final, "no rank trained past the stop step"
    assert newest_checkpoint(tmp_path / "ckpt") == final, "the final checkpoint is at the stop step"
    stop = stops(run_dir)
    assert {r: (e["step"], e["outcome"]) for r, e in stop.items()} == {0: (final, "agreed"), 1: (final, "agreed")}, \
        (stop, logs)
    assert "Traceback" not in logs and "Error" not in logs, logs


def test_a_peer_killed_before_it_proposes_does_not_hold_the_stop(tmp_path: Path) -> None:
    # Rank 1 is SIGKILLed in step 20 (a fault drill, after the all-reduce); rank 0 is signalled in the
    # same step half a second later. Rank 0 proposes 20, waits half its grace for rank 1's proposal,
    # then saves alone at the boundary it is at and exits 143.
    grace = 4.0
    procs = start_ranks(tmp_path, ["--sigterm-at", "20:0@0.5"], grace=grace,
                        faults=[{"kind": "sigkill", "step": 20, "rank": 1}])
    t0 = time.monotonic()
    results = finish_all(procs, timeout=60)
    took = time.monotonic() - t0
    logs = "\n".join(out[-2000:] for _, out in results)
    assert [code for code, _ in results] == [143, -signal.SIGKILL], logs
    run_dir = tmp_path / "run"
    stop = stops(run_dir)
    assert stop[0]["outcome"] == "alone" and stop[0]["step"] == 20, stop
    assert grace / 2 - 0.5 <= stop[0]["seconds"] <= grace, stop
    assert ends(run_dir)[0]["status"] == "sigterm"
    assert newest_checkpoint(tmp_path / "ckpt") == 20
    assert "saving at step 20 without the other ranks" in results[0][1]
    assert took < 45, f"bounded exit: {took:.1f}s"


def test_a_job_that_ends_normally_ends_its_stop_step_waits_quietly(tmp_path: Path) -> None:
    # Each rank's stop-step thread waits in the store rank 0 hosts; it is ended before rank 0 leaves
    # (destroy_process_group, the end of the script), else c10d logs the cut connection with a trace.
    procs = []
    for _ in range(3):
        procs = start_ranks(tmp_path / f"r{len(procs)}{_}", ["--steps", "30"])
        results = finish_all(procs, timeout=90)
        logs = "\n".join(out for _, out in results)
        assert [code for code, _ in results] == [0, 0], logs[-3000:]
        assert "recvValue" not in logs and "Connection was likely closed" not in logs, logs[-3000:]
