"""Exec'd workers restarted in standby interpreters (resctl.launch.standby, `launch.standby`): an unmodified
torchrun-style script, rank 1 SIGKILLed, both restarted workers start in their rank's standby (already past torch's
import), the job ends with the weights of the same script's fault-free run under torchrun, and no standby outlives
the job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.jobs import SNAPSHOT_SCRIPT, assert_same_weights, finish, snapshot_job, start, torchrun

pytestmark = pytest.mark.slow
SAID = "started in its standby interpreter"


def _standbys_of(run_dir: Path) -> list[int]:
    """Standby processes of this run still there (by their title or command, and the run directory in their
    environment)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if (b"resctl-standby" in cmdline or b"resctl.launch.standby" in cmdline) and f"={run_dir}\0".encode() in environ:
            found.append(int(pid))
    return found


def test_a_killed_exec_job_restarts_in_its_standbys_and_ends_as_torchrun_s_run(tmp_path: Path) -> None:
    args = snapshot_job(tmp_path, "standby", steps=40, extra=("--set", "launch.worker_start=exec",
                                                               "--set", "launch.standby=on"))
    code, out = finish(start(args, cwd=tmp_path, env={"RESCTL_FAULTS": "sigkill@15:1"}), timeout=240)
    assert code == 0, out[-4000:]
    log = (tmp_path / "standby" / "launcher.log").read_text()
    assert "local_rank=0 " + SAID in log and "local_rank=1 " + SAID in log, log[-4000:]
    assert _standbys_of(tmp_path / "standby") == []  # the next round's standbys went with the job

    reference = torchrun(["--nproc-per-node", "2", SNAPSHOT_SCRIPT, "--steps", "40", "--step-time", "0.01",
                          "--snapshot", str(tmp_path / "ref-snapshot.pt"), "--out", str(tmp_path / "ref-final.pt")],
                         cwd=tmp_path, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert reference.returncode == 0, reference.stdout[-2000:] + reference.stderr[-2000:]
    assert_same_weights(tmp_path / "standby-final.pt", tmp_path / "ref-final.pt")
