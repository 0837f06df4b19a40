"""`resctl report` and `tune-interval --from-run` tell the truth about an unmodified script that keeps
its own torch.save snapshot (examples/train_snapshot.py): real ft_launcher, gloo workers, real
SIGKILLs, the report run as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import LOCAL_PROFILE, SNAPSHOT_SCRIPT, finish, last_step, start, wait_for, worker_pid

pytestmark = pytest.mark.slow


def args(tmp: Path, name: str, *, every: int = 10, direct: bool = False, sets: tuple[str, ...] = ()) -> list[str]:
    out = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp / name)]
    for item in sets:
        out += ["--set", item]
    out += [SNAPSHOT_SCRIPT, "--steps", "60", "--save-every", str(every), "--step-time", "0.05",
            "--snapshot", str(tmp / f"{name}-snapshot.pt")]
    return out + (["--direct"] if direct else [])


def run(cmd: list[str], cwd: Path, faults: str = "") -> None:
    code, out = finish(start(cmd, cwd=cwd, env={"RESCTL_FAULTS": faults} if faults else {}), timeout=180)
    assert code == 0, out[-4000:]


def report(run_dir: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "resctl", "report", str(run_dir), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def one_recovery(doc: dict[str, Any]) -> dict[str, Any]:
    assert (doc["final_step"], doc["kept_steps"]) == (60, 60), {k: doc[k] for k in ("final_step", "kept_steps")}
    (rec,) = doc["recoveries"]
    assert rec["rollback_steps"] == rec["last_step"] - rec["resumed_step"]
    return rec  # type: ignore[no-any-return]


@pytest.mark.nvrx_independent  # the report's truth about a script's snapshots (the shim's, the report's); the kill
# and restart it goes through run on both NVRx in test_the_demo_report and test_a_kill_of_rank_1_by_hand below
@pytest.mark.parametrize("intercept", [False, True], ids=["observed", "intercepted"])
def test_snapshot_every_10_sigkill_at_25(tmp_path: Path, intercept: bool) -> None:
    sets = ("checkpoint.intercept_torch_save=*job-snapshot.pt", f"checkpoint.dir={tmp_path / 'ckpt'}") if intercept else ()
    run(args(tmp_path, "job", direct=intercept, sets=sets), cwd=tmp_path, faults="sigkill@25:1")
    doc = report(tmp_path / "job")
    rec = one_recovery(doc)
    assert (rec["resumed_step"], rec["last_step"], rec["rollback_steps"]) == (20, 25, 5)
    assert (rec["layer"], rec["cause"], rec["rank"], rec["injected"]) == ("launcher", "sigkill", 1, True)
    assert doc["snapshots"] == 6 and doc["checkpoints"] == 6  # steps 10..60
    cal = doc["calibration"]
    assert cal["interval_steps"] == 10 and cal["saves"] == 6 and cal["write"] > 0
    proc = subprocess.run([sys.executable, "-m", "resctl", "tune-interval", "--from-run", str(tmp_path / "job"),
                           "--mtbf", "24h", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sources = json.loads(proc.stdout)["sources"]
    assert sources["write"].startswith("run") and sources["interval"] == "run", sources


def test_the_demo_report(tmp_path: Path) -> None:
    """examples/demo.sh's job: a snapshot every 5 steps (the script's default), rank 1 SIGKILLed at 25."""
    run(args(tmp_path, "demo", every=5), cwd=tmp_path, faults="sigkill@25:1")
    rec = one_recovery(report(tmp_path / "demo"))
    # rank 0 finishes step 25 (its save included) before its next collective notices the dead peer
    assert rec["resumed_step"] in (20, 25) and rec["last_step"] in (25, 26)
    assert (rec["cause"], rec["rank"]) == ("sigkill", 1)


def test_a_kill_of_rank_1_by_hand_is_blamed_on_rank_1(tmp_path: Path) -> None:
    proc = start(args(tmp_path, "kill"), cwd=tmp_path)
    run_dir = tmp_path / "kill"
    wait_for(lambda: last_step(run_dir, 1) >= 23, 120, "rank 1 to reach step 23", proc)
    pid = worker_pid(run_dir, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)  # what a user or the OOM killer does: no fault event
    code, out = finish(proc, timeout=180)
    assert code == 0, out[-4000:]
    rec = one_recovery(report(run_dir))
    assert (rec["layer"], rec["cause"], rec["rank"], rec["injected"]) == ("launcher", "killed", 1, False)
    assert rec["resumed_step"] % 10 == 0 and rec["resumed_step"] >= 20


@pytest.mark.nvrx_series("0.4")  # in-process restart: NVRx 0.4 only (docs/recovery.md, issue 30)
def test_in_process_exception_on_rank_1(tmp_path: Path) -> None:
    # No hang here: the soft timeout is long, so a rank blocked in C while it waits for slower peers
    # (init_process_group on a loaded box) is not taken for a hung one (test_recovery.IN_PROCESS says more).
    sets = ("inprocess.enabled=true", "inprocess.soft_timeout=20s", "inprocess.hard_timeout=25s",
            "inprocess.barrier_timeout=40s", "inprocess.heartbeat_timeout=10s", "inprocess.monitor_interval=0.5s",
            "inprocess.progress_interval=0.5s", "inprocess.last_call_wait=0.1s",
            "inprocess.termination_grace_time=1s", "inprocess.min_world_size=2", "heartbeat.timeout=50s")
    run(args(tmp_path, "inproc", sets=sets), cwd=tmp_path, faults="exception@25:1")
    rec = one_recovery(report(tmp_path / "inproc"))
    assert (rec["layer"], rec["cause"], rec["rank"], rec["injected"]) == ("inprocess", "exception", 1, True)
    assert (rec["resumed_step"], rec["rollback_steps"]) == (20, 5)
