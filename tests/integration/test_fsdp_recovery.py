"""FSDP2 jobs (examples/train_fsdp.py: `fully_shard` on each block and the model, gloo on CPU, a shuffled
DistributedSampler) killed at random steps end bitwise equal to the same script's uninterrupted run under
torchrun (issue 41, item 4), resumed by the launcher (SIGKILL of a rank) or in process (an exception; NVRx
0.4 only), with `checkpoint.data_position` putting each loader at the batch after the checkpoint's step.
The same script checkpointing itself with torch.distributed.checkpoint (`--dcp`) gets a true
`resctl report`: its saves counted, the resume step and the rollback (item 5).

The kill steps are drawn at random (RESCTL_FSDP_SEED fixes them; every message names them).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, start, torchrun
from tests.integration.test_recovery import IN_PROCESS, assert_bitwise_equal

# The subject is resctl's sharded checkpoint, memory tier and data position and the report of the script's own
# DCP saves, the same code on every NVRx; the launcher restarts they go through run on both versions
# (tests/integration/test_recovery.py). CI's 0.7.0 pass leaves this file out.
pytestmark = [pytest.mark.slow, pytest.mark.nvrx_independent]
SCRIPT = str(EXAMPLES / "train_fsdp.py")
EVERY = 5  # checkpoint.interval_steps, and the script's --save-every
STEPS = {2: 24, 4: 12}  # 128 samples, batch 8, 3 epochs: steps of the whole run by world size
SEED = int(os.environ.get("RESCTL_FSDP_SEED", random.randrange(1 << 30)))

Reference = Callable[[int], dict[str, Any]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The uninterrupted run under plain torchrun, once per world size."""
    done: dict[int, dict[str, Any]] = {}

    def run(nproc: int) -> dict[str, Any]:
        if nproc not in done:
            tmp = tmp_path_factory.mktemp(f"fsdp-ref{nproc}")
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            proc = torchrun(["--nproc-per-node", str(nproc), "--standalone", SCRIPT, "--out", str(tmp / "ref.pt")],
                            cwd=tmp, env=env, timeout=240)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            done[nproc] = torch.load(tmp / "ref.pt", weights_only=True)
            assert done[nproc]["step"] == STEPS[nproc]
        return done[nproc]

    return run


def job(tmp: Path, nproc: int, worker_start: str, sets: tuple[str, ...] = (), script: tuple[str, ...] = ()) -> list[str]:
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", str(nproc), "--run-dir", str(tmp / "run")]
    for item in (f"checkpoint.dir={tmp / 'ckpt'}", f"checkpoint.interval_steps={EVERY}", "heartbeat.timeout=5s",
                 "launch.max_restarts=4", f"launch.worker_start={worker_start}", *sets):
        args += ["--set", item]
    return [*args, SCRIPT, "--out", str(tmp / "out.pt"), *script]


def kill_steps(case: str, nproc: int, count: int) -> list[int]:
    """`count` distinct steps after the first checkpoint and before the last step, drawn for this case."""
    rng = random.Random(f"{SEED}-{case}")
    return sorted(rng.sample(range(EVERY + 1, STEPS[nproc]), count))


def run_job(args: list[str], cwd: Path, faults: str) -> str:
    code, out = finish(start(args, cwd=cwd, env={"RESCTL_FAULTS": faults}), timeout=300)
    assert code == 0, f"faults {faults} (RESCTL_FSDP_SEED={SEED}):\n{out[-4000:]}"
    return out


def resumes(run_dir: Path) -> list[tuple[int, int]]:
    """(cycle or in-process iteration, step) of each resume after the first start, rank 0's."""
    return [(e["cycle"] + e["iteration"], e["step"]) for e in events(run_dir)
            if e["kind"] == "resume" and e["rank"] == 0 and (e["cycle"] or e["iteration"])]


def checkpoint_before(step: int) -> set[int]:
    """What a fault at `step` may resume from: the newest multiple of EVERY before it (the fault comes in the
    step's optimizer step, before its save), or the one before when that save was still being written."""
    newest = (step - 1) // EVERY * EVERY
    return {newest, max(0, newest - EVERY)}


CASES = {
    # case: (ranks, in-process, kills). In-job: two SIGKILLs (one of each of two ranks) at random steps.
    "2ranks-injob": (2, False, 2),
    "4ranks-injob": (4, False, 1),  # four shards of every tensor, a 4-way sampler
    "2ranks-inprocess": (2, True, 1),
}


def _case_params() -> list[Any]:
    out = []
    for case, (_, inprocess, _) in CASES.items():
        modes = ("fork",) if inprocess else ("fork", "exec")
        marks = [pytest.mark.nvrx_series("0.4")] if inprocess else []  # in-process restart: NVRx 0.4 only
        out += [pytest.param(case, mode, marks=marks, id=f"{case}-{mode}") for mode in modes]
    return out


@pytest.mark.parametrize("case,worker_start", _case_params())
def test_an_fsdp2_job_killed_at_random_steps_ends_bitwise_equal(tmp_path: Path, reference: Reference, case: str,
                                                                worker_start: str) -> None:
    nproc, inprocess, count = CASES[case]
    steps = kill_steps(case, nproc, count)
    if inprocess:
        faults = f"exception@{steps[0]}:{nproc - 1}"
        sets: tuple[str, ...] = ("checkpoint.data_position=true", *IN_PROCESS, "heartbeat.timeout=25s")
    else:
        faults = ",".join(f"sigkill@{s}:{r % nproc}" for s, r in zip(steps, (nproc - 1, 0)))
        sets = ("checkpoint.data_position=true",)
    out = run_job(job(tmp_path, nproc, worker_start, sets), tmp_path, faults)
    run_dir = tmp_path / "run"
    why = f"faults {faults} (RESCTL_FSDP_SEED={SEED})"
    got = resumes(run_dir)
    assert len(got) == count and all(s in checkpoint_before(k) for (_, s), k in zip(got, steps)), (got, why)
    ev = events(run_dir)
    layers = {e.get("layer") for e in ev if e["kind"] == "restart"}
    assert ("inprocess" in layers) == inprocess, (layers, why)
    final = torch.load(tmp_path / "out.pt", weights_only=True)
    assert final["step"] == STEPS[nproc], why
    assert_bitwise_equal(final, reference(nproc))
    # The loaders resumed where the checkpoints were taken: every rank, every mid-epoch resume, no approximation.
    notes = [(e["rank"], e["action"]) for e in ev if e["kind"] == "data_position"]
    mid_epoch = [s for _, s in got if s % (STEPS[nproc] // 3)]
    assert sorted(notes) == sorted((r, "resumed") for r in range(nproc) for _ in mid_epoch), (notes, got, why)
    # The script says where it resumed when that is not the start: a kill before the first save was durable
    # resumes from step 0 (checkpoint_before allows it), which the script does not print.
    for _, s in got:
        assert (f"resumed from step {s}" in out) == (s > 0), (s, why)
    # resctl's own sharded checkpoints go through dcp.save too: recorded by the engine, not as the script's own
    assert {e["path"] for e in ev if e["kind"] == "snapshot"} <= {str(tmp_path / "out.pt.tmp")}, why


def report(run_dir: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "resctl", "report", str(run_dir), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("worker_start", ["fork", "exec"])
@pytest.mark.parametrize("save", ["save", "async_save"])
def test_a_script_that_checkpoints_with_dcp_itself_gets_a_true_report(tmp_path: Path, reference: Reference, save: str,
                                                                       worker_start: str) -> None:
    """`--dcp`: dcp.save (or dcp.async_save on its own gloo group) every 5 steps into the script's own
    directory, dcp.load of the newest at start; rank 1 SIGKILLed at a random step. With no edit and no
    resctl.checkpoint, the report counts the script's checkpoints, resumes at the step it loaded, and
    rolls back from the kill to it; the run ends bitwise equal to torchrun's uninterrupted one."""
    (step,) = kill_steps(f"dcp-{save}", 2, 1)
    script = ("--dcp", str(tmp_path / "own"), "--save-every", str(EVERY), *(("--async-save",) if save == "async_save" else ()))
    run_job(job(tmp_path, 2, worker_start, script=script), tmp_path, f"sigkill@{step}:1")
    why = f"sigkill@{step}:1 (RESCTL_FSDP_SEED={SEED})"
    doc = report(tmp_path / "run")
    assert (doc["final_step"], doc["kept_steps"]) == (24, 24), ({k: doc[k] for k in ("final_step", "kept_steps")}, why)
    (rec,) = doc["recoveries"]
    assert (rec["layer"], rec["cause"], rec["rank"], rec["last_step"]) == ("launcher", "sigkill", 1, step), (rec, why)
    # dcp.save returns complete; an async save still in flight when the kill came (rank 1's shards, or the
    # collective that ends it) is not a checkpoint: the script resumes from the one before (0: from scratch).
    newest = (step - 1) // EVERY * EVERY
    assert rec["resumed_step"] in (checkpoint_before(step) if save == "async_save" else {newest}), (rec, why)
    assert rec["rollback_steps"] == step - rec["resumed_step"], (rec, why)
    # steps 5, 10, 15, 20 by DCP, and the script's final torch.save of --out at 24
    assert doc["snapshots"] == doc["checkpoints"] == 5, ({k: doc[k] for k in ("snapshots", "checkpoints")}, why)
    loads = {(e["rank"], e["step"], e.get("source")) for e in events(tmp_path / "run") if e["kind"] == "resume" and e["cycle"]}
    assert loads == ({(r, rec["resumed_step"], "dcp.load") for r in (0, 1)} if rec["resumed_step"] else set()), (loads, why)
    assert_bitwise_equal(torch.load(tmp_path / "out.pt", weights_only=True), reference(2))
