"""The memory tier end to end: a real 2-rank `resctl run` job, a rank SIGKILLed mid-interval.

With `interval_steps = 20` and `memory_every = 1`, a SIGKILL of rank 1 at step 27 must resume
from host memory at step 26 or 27 (not from the disk checkpoint of step 20), lose at most one
step in `resctl report`'s analysis, end bitwise equal to a fault-free run without the memory
tier, and leave nothing behind in the shared-memory root.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from resctl.telemetry.goodput import analyze
from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, start
from tests.integration.test_recovery import assert_same_final

pytestmark = pytest.mark.slow
STEPS = 40


def memory_job(tmp: Path, name: str, memory_every: int) -> list[str]:
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp / name)]
    for item in (f"checkpoint.dir={tmp / (name + '-ckpt')}", "checkpoint.interval_steps=20",
                 f"checkpoint.memory_every={memory_every}", "heartbeat.timeout=4s", "heartbeat.check_interval=1s",
                 "launch.max_restarts=3"):
        args += ["--set", item]
    return [*args, str(EXAMPLES / "train_ckpt.py"), "--steps", str(STEPS), "--step-time", "0.02",
            "--out", str(tmp / f"{name}.pt")]


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    code, out = finish(start(args, cwd=cwd, env=env), timeout=150)
    assert code == 0, out[-4000:]
    return out


@pytest.fixture
def shm(tmp_path: Path) -> Iterator[Path]:
    """A fresh shared-memory root on tmpfs (/dev/shm, as in production) when there is one."""
    base = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="resctl-test-", dir=base)) if base.is_dir() else tmp_path / "shm"
    root.mkdir(exist_ok=True)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.nvrx_independent  # the memory tier's restore (resctl's); the launcher's restart after a SIGKILL runs on
# both NVRx in test_recovery, and the tier's lifetime around the launcher in the test below
def test_sigkill_at_27_resumes_from_memory_within_one_step_and_ends_bitwise_equal(tmp_path: Path, shm: Path) -> None:
    env = {"RESCTL_SHM_DIR": str(shm)}
    run(memory_job(tmp_path, "ref", 0), cwd=tmp_path, env=env)
    run(memory_job(tmp_path, "kill", 1), cwd=tmp_path, env={**env, "RESCTL_FAULTS": "sigkill@27:1"})
    ev = events(tmp_path / "kill")
    assert {e["cycle"] for e in ev if e["kind"] == "start"} == {0, 1}
    loads = [e for e in ev if e["kind"] == "ckpt_load"]
    assert loads and {e["tier"] for e in loads} == {"memory"}, loads
    assert {e["step"] for e in loads} <= {26, 27} and len({e["step"] for e in loads}) == 1, loads
    (recovery,) = analyze(ev).recoveries
    assert recovery.cause == "sigkill" and recovery.resumed_step in (26, 27), recovery
    assert recovery.rollback_steps <= 1, recovery
    assert recovery.tier == "memory", recovery  # what `resctl report` shows next to the rollback
    # Only the disk checkpoints of steps 20 and 40 were written; the resume did not come from them.
    assert_same_final(tmp_path / "kill.pt", tmp_path / "ref.pt")
    assert list(shm.iterdir()) == [], "memory snapshots left behind after the job ended"


def test_resctl_run_removes_the_memory_of_a_job_that_failed(tmp_path: Path, shm: Path) -> None:
    """No worker ends cleanly here (the SIGKILLed rank takes the job down: no restarts allowed),
    so only `resctl run`'s backstop can release the snapshots both ranks took."""
    args = memory_job(tmp_path, "fail", 1)
    args[args.index("launch.max_restarts=3")] = "launch.max_restarts=0"
    code, out = finish(start(args, cwd=tmp_path, env={"RESCTL_SHM_DIR": str(shm), "RESCTL_FAULTS": "sigkill@8:1"}),
                       timeout=150)
    assert code != 0, out[-3000:]
    assert any(e["kind"] == "ckpt_mem" for e in events(tmp_path / "fail")), "no snapshot was taken"
    assert list(shm.iterdir()) == [], "memory snapshots of a failed job left behind"
