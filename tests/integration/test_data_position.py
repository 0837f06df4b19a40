"""Exact resume mid-epoch (issue 23), end to end: the issue's new-user script (examples/train_loader.py:
2 ranks, 256 samples, batch 8 = 16 steps an epoch, 6 epochs, a shuffled DistributedSampler through a
DataLoader with 2 workers, checkpoints every 5 steps) is killed mid-epoch and must end at step 96
bitwise equal to the same script's uninterrupted run under torchrun. Without a data position it
trains 9 batches twice and ends at step 105 (tests/unit/test_data_position.py shows that in-process).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, last_step, start, torchrun, wait_for
from tests.integration.test_recovery import IN_PROCESS, assert_bitwise_equal

pytestmark = [pytest.mark.slow, pytest.mark.nvrx_independent]
SCRIPT = str(EXAMPLES / "train_loader.py")


Reference = Callable[[tuple[str, ...]], dict[str, Any]]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The uninterrupted run of the script with these arguments under plain torchrun (once each)."""
    done: dict[tuple[str, ...], dict[str, Any]] = {}

    def reference(script_args: tuple[str, ...]) -> dict[str, Any]:
        if script_args not in done:
            tmp = tmp_path_factory.mktemp("loader-ref")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            proc = torchrun(["--nproc-per-node", "2", "--standalone", SCRIPT, *script_args, "--out", str(tmp / "ref.pt")],
                            cwd=tmp, env=env, timeout=240)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            done[script_args] = torch.load(tmp / "ref.pt", weights_only=True)
        return done[script_args]

    return reference


@pytest.fixture(scope="module")
def reference(references: Reference) -> dict[str, Any]:
    return references(())


def job(tmp: Path, name: str, sets: tuple[str, ...], script_args: tuple[str, ...] = (), nproc: int = 2) -> list[str]:
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", str(nproc), "--run-dir", str(tmp / name)]
    for item in (f"checkpoint.dir={tmp / 'ckpt'}", "checkpoint.interval_steps=5", "heartbeat.timeout=4s", *sets):
        args += ["--set", item]
    return [*args, SCRIPT, "--out", str(tmp / f"{name}.pt"), *script_args]


def resumed_steps(run_dir: Path) -> list[int]:
    return sorted({e["step"] for e in events(run_dir) if e["kind"] == "resume" and e["step"]})


DATA = "checkpoint.data_position=true"
PER_RANK = ("--per-rank", "--num-workers", "0", "--epochs", "2")  # the run's data setup: its reference's arguments
CASES = {
    # case: (profile settings, script args, reference args, fault drill, the step the job resumes at). The
    # loader's workers are persistent except in the first (both kinds of worker are unit-tested).
    "sigkill": ((DATA,), (), (), "sigkill@27:1", 25),
    "inprocess-explicit-state": ((*IN_PROCESS, "heartbeat.timeout=25s"), ("--explicit", "--persistent"), (),
                                 "exception@27:1", 25),
    "memory-tier": ((DATA, "checkpoint.memory_every=1"), ("--persistent",), (), "sigkill@27:1", 26),
    # A torchrun-style script's own torch.save snapshot, intercepted: the position rides beside it.
    "torch-save-snapshot": ((DATA, "checkpoint.intercept_torch_save=*snap.pt"), ("--snapshot", "snap.pt"), (),
                            "sigkill@27:1", 25),
}


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.nvrx_series("0.4")) if c.startswith("inprocess")
                                  else c for c in CASES])  # in-process restart: NVRx 0.4 only (issue 30)
def test_a_job_killed_mid_epoch_ends_equal_to_the_uninterrupted_run(tmp_path: Path, references: Reference,
                                                                     case: str) -> None:
    sets, script_args, ref_args, faults, resume_at = CASES[case]
    code, out = finish(start(job(tmp_path, "run", sets, script_args), cwd=tmp_path, env={"RESCTL_FAULTS": faults}))
    assert code == 0, out[-4000:]
    assert resumed_steps(tmp_path / "run") == [resume_at], out[-3000:]
    got, reference = torch.load(tmp_path / "run.pt", weights_only=True), references(ref_args)
    assert got["step"] == reference["step"]
    assert_bitwise_equal(got, reference)
    notes = [e for e in events(tmp_path / "run") if e["kind"] == "data_position"]
    assert {(e["rank"], e["action"]) for e in notes} == {(0, "resumed"), (1, "resumed")}, notes
    assert f"resumed after {resume_at - 16} of 16 batches" in out


def test_a_stopped_job_resumed_by_a_second_one_ends_equal(tmp_path: Path, reference: dict[str, Any]) -> None:
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


def trained(trace: Path, epoch: int) -> list[int]:
    """The sample indices trained in `epoch`, by every rank of every job that appended to `trace`."""
    out: list[int] = []
    for path in trace.parent.glob(f"{trace.name}.rank*"):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            out += rec["indices"] if rec["epoch"] == epoch else []
    return sorted(out)


def test_a_job_resumed_with_fewer_ranks_trains_the_rest_of_the_epoch_once(tmp_path: Path) -> None:
    """World size 2 -> 1 with a DistributedSampler: the epoch goes on after the job's first 144 samples,
    re-split over one rank (docs/checkpoint.md, "another world size")."""
    trace = tmp_path / "trace"
    args = ("--epoch-state", "--num-workers", "0", "--epochs", "2", "--trace", str(trace))
    code, out = finish(start(job(tmp_path, "two", (DATA,), (*args, "--max-steps", "25")), cwd=tmp_path))
    assert code == 0, out[-4000:]
    code, out = finish(start(job(tmp_path, "one", (DATA,), args, nproc=1), cwd=tmp_path))
    assert code == 0, out[-4000:]
    assert "world size 2 -> 1: epoch 1 resumes after the job's first 144 samples, re-split over 1 ranks" in out
    assert {e["action"] for e in events(tmp_path / "one") if e["kind"] == "data_position"} == {"resplit", "resumed"}
    assert trained(trace, 0) == trained(trace, 1) == list(range(256))  # each sample once an epoch
    assert torch.load(tmp_path / "one.pt", weights_only=True)["step"] == 25 + 112 // 8


def test_a_per_rank_loader_resumes_exactly_and_refuses_another_world_size(tmp_path: Path,
                                                                         references: Reference) -> None:
    """Each rank's own shard in a rank-seeded RandomSampler order. Killed mid-epoch, rank 1 resumes from
    its own position (on disk: rank 0's would give it rank 0's order) and the run ends bitwise equal.
    Then a job of 1 rank from the same checkpoints (the newest, step 30, is mid-epoch): no job-wide
    order to re-split, so it stops at once with exit 2 and the reason (no restart can cure it)."""
    code, out = finish(start(job(tmp_path, "two", (DATA,), PER_RANK), cwd=tmp_path,
                             env={"RESCTL_FAULTS": "sigkill@27:1"}))
    assert code == 0, out[-4000:]
    assert resumed_steps(tmp_path / "two") == [25], out[-3000:]
    got, reference = torch.load(tmp_path / "two.pt", weights_only=True), references(PER_RANK)
    assert got["step"] == reference["step"] == 32
    assert_bitwise_equal(got, reference)
    code, out = finish(start(job(tmp_path, "one", (DATA,), PER_RANK, nproc=1), cwd=tmp_path))
    assert code == 2, out[-4000:]
    assert "the world size changed (2 -> 1) and a RandomSampler keeps no job-wide order to re-split" in out, out[-3000:]
    assert "stopped the job" in out and "DataPositionMismatch" in out, out[-3000:]
    assert {e["cycle"] for e in events(tmp_path / "one") if e["kind"] == "start"} == {0}
