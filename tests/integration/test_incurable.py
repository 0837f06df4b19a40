"""Faults no restart can cure stop the job at once instead of restarting up to max_restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.jobs import events, finish, start
from tests.integration.test_recovery import job, run

pytestmark = pytest.mark.slow


def test_a_checkpoint_that_does_not_fit_the_model_stops_the_job_with_exit_2(tmp_path: Path) -> None:
    run(job(tmp_path, "first", 2, steps=6), cwd=tmp_path)  # leaves checkpoints of a width-8 model
    args = [a.replace("second-ckpt", "first-ckpt") for a in job(tmp_path, "second", 2, steps=6)]
    code, out = finish(start([*args, "--width", "16"], cwd=tmp_path), timeout=120)
    assert code == 2, out[-3000:]
    assert "stopped the job" in out and "CheckpointMismatch" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]  # a refusal is its message, not a stack (the brief: no traceback)
    cycles = {e["cycle"] for e in events(tmp_path / "second") if e["kind"] == "start"}
    assert cycles == {0}, f"restarted although no restart can cure it: cycles {cycles}"
