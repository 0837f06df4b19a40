"""Exact resume mid-epoch (issue 23), end to end: the issue's new-user script (examples/train_loader.py:
2 ranks, 256 samples, batch 8 = 16 steps an epoch, 6 epochs, a shuffled DistributedSampler through a
DataLoader with 2 workers, checkpoints every 5 steps) is killed mid-epoch and must end at step 96
bitwise equal to the same script's uninterrupted run under torchrun. Without a data position it
trains 9 batches twice and ends at step 105 (tests/unit/test_data_position.py shows that in-process).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, last_step, start, wait_for
from tests.integration.test_recovery import IN_PROCESS, assert_bitwise_equal

pytestmark = pytest.mark.slow
SCRIPT = str(EXAMPLES / "train_loader.py")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The uninterrupted run: the same script under plain torchrun."""
    tmp = tmp_path_factory.mktemp("loader-ref")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--standalone", SCRIPT, "--out", str(tmp / "ref.pt")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return torch.load(tmp / "ref.pt", weights_only=True)


def job(tmp: Path, name: str, sets: tuple[str, ...], script_args: tuple[str, ...] = ()) -> list[str]:
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp / name)]
    for item in (f"checkpoint.dir={tmp / 'ckpt'}", "checkpoint.interval_steps=5", "heartbeat.timeout=4s", *sets):
        args += ["--set", item]
    return [*args, SCRIPT, "--out", str(tmp / f"{name}.pt"), *script_args]


def resumed_steps(run_dir: Path) -> list[int]:
    return sorted({e["step"] for e in events(run_dir) if e["kind"] == "resume" and e["step"]})


DATA = "checkpoint.data_position=true"
CASES = {
    # case: (profile settings, script args, fault drill, the step the job resumes at). The loader's
    # workers are persistent except in the first (both kinds of worker are unit-tested).
    "sigkill": ((DATA,), (), "sigkill@27:1", 25),
    "inprocess-explicit-state": ((*IN_PROCESS, "heartbeat.timeout=25s"), ("--explicit", "--persistent"),
                                 "exception@27:1", 25),
    "memory-tier": ((DATA, "checkpoint.memory_every=1"), ("--persistent",), "sigkill@27:1", 26),
    # A torchrun-style script's own torch.save snapshot, intercepted: the position rides beside it.
    "torch-save-snapshot": ((DATA, "checkpoint.intercept_torch_save=*snap.pt"), ("--snapshot", "snap.pt"),
                            "sigkill@27:1", 25),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_job_killed_mid_epoch_ends_equal_to_the_uninterrupted_run(tmp_path: Path, reference: dict[str, object],
                                                                     case: str) -> None:
    sets, script_args, faults, resume_at = CASES[case]
    code, out = finish(start(job(tmp_path, "run", sets, script_args), cwd=tmp_path, env={"RESCTL_FAULTS": faults}))
    assert code == 0, out[-4000:]
    assert resumed_steps(tmp_path / "run") == [resume_at], out[-3000:]
    got = torch.load(tmp_path / "run.pt", weights_only=True)
    assert got["step"] == 96
    assert_bitwise_equal(got, reference)
    notes = [e for e in events(tmp_path / "run") if e["kind"] == "data_position"]
    assert {(e["rank"], e["action"]) for e in notes} == {(0, "resumed"), (1, "resumed")}, notes
    assert f"resumed after {resume_at - 16} of 16 batches" in out


def test_a_stopped_job_resumed_by_a_second_one_ends_equal(tmp_path: Path, reference: dict[str, object]) -> None:
    first = start(job(tmp_path, "first", (DATA, "checkpoint.sigterm_grace=8s"), ("--step-time", "0.05", "--persistent")),
                  cwd=tmp_path)
    wait_for(lambda: last_step(tmp_path / "first", 0) >= 20, 120, "step 20", first)
    os.kill(first.pid, signal.SIGTERM)
    code, out = finish(first, timeout=60)
    assert code != 0, out[-3000:]
    stopped = [e["step"] for e in events(tmp_path / "first") if e["kind"] == "stop"]
    assert stopped, out[-3000:]
    code, out = finish(start(job(tmp_path, "second", (DATA,), ("--persistent",)), cwd=tmp_path))
    assert code == 0, out[-4000:]
    assert resumed_steps(tmp_path / "second") == [stopped[0]]
    got = torch.load(tmp_path / "second.pt", weights_only=True)
    assert got["step"] == 96
    assert_bitwise_equal(got, reference)
