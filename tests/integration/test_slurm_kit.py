"""examples/slurm/train.sbatch, unchanged, on a real two-node Slurm (Debian's 22.05 packages, two slurmd
on this host as n1 and n2; see slurm_cluster.py). The CPU variant (`sbatch --gpus-per-node=0`) trains
examples/train_ckpt.py with one gloo worker per node.

Signals are sent the way Slurm sends them: the pre-timeout warning is Slurm's own (`--signal=B:USR1@90`, to
the batch shell only), preemption with a GraceTime is SIGTERM to the
job's steps (`scancel --signal=TERM`, not the batch shell), a user's cancel is a plain `scancel`.

The two nodes' signals often land on either side of a step boundary; the ranks still save at one step,
the stop step they agree on through the job's store (resctl/shim/stopstep.py). Before it, rank 1 saved
and left while rank 0 was in the next step's all-reduce, which failed: no final checkpoint (about 1 run
in 5 here).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from resctl.checkpoint.format import list_step_dirs, read_manifest
from resctl.telemetry.events import read_events
from tests.integration.slurm_cluster import SlurmCluster, missing
from tests.integration.test_owned_rdzv import _lose
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
SBATCH = REPO / "examples" / "slurm" / "train.sbatch"
PROFILE = REPO / "tests" / "fixtures" / "slurm" / "cpu.toml"
SCRIPT = REPO / "examples" / "train_ckpt.py"

# nvrx_independent: the Slurm kit's own drills (sbatch, signals to the batch shell and steps, requeue); the launcher's job stop and node loss they go through run on every NVRx in
# test_node_stop, test_stop_phases and test_external_store (CI's pass 2).
pytestmark = [pytest.mark.slow, pytest.mark.nvrx_independent]

# Seconds each step sleeps after the optimizer step: short enough that the two nodes' signals often
# straddle a step boundary (what the stop step is for).
STEP_TIME = "0.2"


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def submit(slurm: SlurmCluster, work: Path, *sbatch_args: str, doctor: bool = True,
           env: dict[str, str] | None = None) -> str:
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **slurm.env,
        "PATH": f"{Path(sys.executable).parent}:{slurm.env.get('PATH', '')}",
        "RESCTL": f"{sys.executable} -m resctl",
        "PROFILE": str(PROFILE),
        "SCRIPT": str(SCRIPT),
        "DOCTOR": "1" if doctor else "0",
        "RESCTL_CHECKPOINT_DIR": str(work / "ckpt"),
        "RESCTL_LAUNCH_RUN_DIR": str(work / "run"),
        "RESCTL_LAUNCH_RDZV_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    import subprocess

    out = subprocess.run(
        ["sbatch", "--parsable", "--gpus-per-node=0", f"--chdir={work}", f"--output={work}/out.log", *sbatch_args, str(SBATCH),
         "--steps", "1000000", "--step-time", STEP_TIME],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    return out.strip().split(";")[0]


def wait_for(what: str, predicate: Any, timeout: float, slurm: SlurmCluster, work: Path, job: str = "") -> Any:
    deadline = time.monotonic() + timeout
    states: list[str] = []
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job:
            state = slurm.job(job)
            seen = f"{state['JobState']}/{state.get('Reason')}"
            if not states or states[-1] != seen:
                states.append(seen)
            if state["JobState"] in ("FAILED", "CANCELLED", "COMPLETED", "TIMEOUT", "NODE_FAIL"):
                # The job ended between the predicate's look and this one: the end may be what is awaited
                # (the job COMPLETED just then, which failed this wait once); asked once more, then given up.
                value = predicate()
                if value:
                    return value
                break  # it will not happen any more
        time.sleep(0.3)
    waited = timeout - max(0.0, deadline - time.monotonic())
    text = (work / "out.log").read_text(errors="replace") if (work / "out.log").exists() else "(no log)"
    key = "\n".join(line for line in text.splitlines()
                    if re.match(r"(resctl:|srun:|slurmstepd|\[rank \d\] resumed|\w*Error)", line))
    state = {k: v for k, v in slurm.job(job).items() if k in ("JobState", "Reason", "Restarts", "ExitCode")} if job else {}
    # The daemons' logs first and the job's own lines last: a CI log shows the tail.
    raise AssertionError(f"{slurm.logs()}\n--- job log, end\n{text[-3000:]}\n--- job log, key lines\n{key}\n"
                         f"gave up after {waited:.0f} of {timeout}s (or the job ended) waiting for {what}; job {state}, "
                         "states seen "
                         f"{' -> '.join(states)}")


def steps_reached(work: Path) -> int:
    """The highest optimizer step any rank reported."""
    return max((e["step"] for e in read_events(work / "run") if e["kind"] == "step"), default=0)


def newest_checkpoint(work: Path) -> int:
    """The newest complete, verified checkpoint's step (0 when none)."""
    for step, path in list_step_dirs(work / "ckpt"):
        try:
            read_manifest(path / "manifest.json")
            return step
        except Exception:  # noqa: BLE001 - any unreadable candidate is skipped
            continue
    return 0


def assert_one_final_save(work: Path, after: float) -> int:
    """Both ranks (their events since `after`) stopped on SIGTERM at the step they agreed on, no rank
    trained past it, and the newest checkpoint is at that step; returns it."""
    reached = steps_reached(work)
    events = [e for e in read_events(work / "run") if e["t"] >= after]
    newest = newest_checkpoint(work)
    ends = {e["rank"]: (e["status"], e.get("step")) for e in events if e["kind"] == "end"}
    stops = {e["rank"]: (e["outcome"], e["step"]) for e in events if e["kind"] == "stop"}
    detail = f"ends {ends}, stops {stops}, newest checkpoint {newest}, training reached {reached}"
    assert newest == reached, f"the final checkpoint is at the step training reached: {detail}"
    assert ends == {0: ("sigterm", reached), 1: ("sigterm", reached)}, detail
    assert stops == {0: ("agreed", reached), 1: ("agreed", reached)}, detail
    return reached


def test_pretimeout_signal_saves_requeues_and_resumes_then_preemption_saves(slurm: SlurmCluster, tmp_path: Path) -> None:
    work = tmp_path / "job"
    # Slurm itself sends USR1 to the batch shell, at its first 30 s timer check where the time left is under the
    # warning time plus 30 s: with a 3-minute limit and a 90 s warning, 60-90 s after the start (observed: a
    # 1-minute limit's 40 s warning came 0-30 s after the start, before both nodes trained on a slow CI box).
    # No doctor step, so the warning lands in training.
    job = submit(slurm, work, "--time=3", "--signal=B:USR1@90", doctor=False)
    wait_for("two nodes training", lambda: {e["rank"] for e in read_events(work / "run") if e["kind"] == "step"} == {0, 1},
             120, slurm, work, job)
    state = slurm.job(job)
    assert state["NodeList"] == "n[1-2]" and state["NumNodes"] == "2", state

    # Requeued: pending again with the same id, held until its BeginTime (now + 120 s in 22.05).
    requeued = {"JobState": "PENDING", "Restarts": "1", "Reason": "BeginTime"}
    wait_for("the pre-timeout requeue", lambda: requeued.items() <= slurm.job(job).items(), 120, slurm, work)
    reached = assert_one_final_save(work, after=0)
    assert reached > 0
    log = (work / "out.log").read_text()
    assert "time limit near (USR1)" in log and "requeueing job" in log
    assert "forcing job termination" not in log and "Killed" not in log, "srun must not SIGKILL the step"

    # Start it now rather than in 120 s, with room to finish this test, once the old allocation is released.
    # Not in the same second as the requeue: slurmd revokes the job's credential at the kill (1 s resolution)
    # and refuses a new one from that second ("Killing non-startable batch job: Job credential revoked").
    slurm.wait_idle(60)
    time.sleep(2)
    slurm.run("scontrol", "update", f"jobid={job}", "starttime=now", "timelimit=30")
    wait_for("the requeued job to resume", lambda: f"resumed from checkpoint step {reached}" in
             (work / "out.log").read_text(), 120, slurm, work, job)
    wait_for("training past the resume point", lambda: steps_reached(work) >= reached + 30, 120, slurm, work, job)
    assert len(re.findall(r"\[rank \d\] resumed from checkpoint step", (work / "out.log").read_text())) == 2

    # Preemption: SIGTERM to the steps (what Slurm sends for GraceTime), not to the batch shell.
    preempted_at = time.time()
    slurm.run("scancel", "--signal=TERM", job)
    wait_for("the job to end", lambda: slurm.job(job)["JobState"] not in ("RUNNING", "PENDING", "COMPLETING"),
             90, slurm, work)
    reached2 = assert_one_final_save(work, after=preempted_at)
    assert reached2 > reached
    final = slurm.job(job)
    assert final["Restarts"] == "1", "the script requeues only on the pre-timeout signal"


def _step_of_rank_0(job: str, work: Path) -> tuple[int, str]:
    """The `resctl run` (this job's training step) whose workers include rank 0's first, and its node."""
    worker = next(e["pid"] for e in read_events(work / "run") if e["kind"] == "start" and e["rank"] == 0)
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.info["cmdline"][1:4] != ["-m", "resctl", "run"] or proc.environ().get("SLURM_JOB_ID") != job:
                continue
            if worker in {c.pid for c in proc.children(recursive=True)}:
                return proc.pid, proc.environ()["SLURMD_NODENAME"]
        except (psutil.Error, TypeError):
            continue
    raise AssertionError(f"no `resctl run` of job {job} runs rank 0's worker {worker}")


def test_node_0s_step_lost_the_other_trains_on_then_user_scancel_stops_without_requeue(slurm: SlurmCluster,
                                                                                      tmp_path: Path) -> None:
    """RDZV_STORE=external (the store on the batch step) and nodes 1:2: the training step of the node that runs
    rank 0 is lost (its `resctl run` and workers frozen, then killed, as an OOM kill or a crash takes them; the
    batch step and the store stay): the other node holds a restart round alone, rank 0 now, resumes from the
    last checkpoint and trains on. A lost machine is not this: both slurmd of this test share one host and its
    loopback, so nothing can unplug one of them, and Slurm itself answers a node it finds down (SlurmdTimeout)
    by ending the whole job (NODE_FAIL) and, #SBATCH --requeue, requeueing it; the batch host's loss ends the
    job's allocation whatever the store. Then a plain `scancel` stops the job without a requeue."""
    work = tmp_path / "job"
    store = {"RDZV_STORE": "external", "RDZV_STORE_PORT": str(free_port()), "RESCTL_LAUNCH_NNODES": "1:2",
             "RESCTL_CHECKPOINT_INTERVAL_STEPS": "10"}
    job = submit(slurm, work, env=store)  # with the doctor preflight on both nodes
    wait_for("both nodes training past step 20 and a checkpoint",
             lambda: steps_reached(work) >= 20 and newest_checkpoint(work) >= 10 and
             {e["rank"] for e in read_events(work / "run") if e["kind"] == "start"} == {0, 1}, 120, slurm, work, job)
    step_pid, node = _step_of_rank_0(job, work)
    saved = newest_checkpoint(work)
    lost_at = time.time()
    _lose(step_pid)

    def resumed() -> dict[str, Any] | None:
        ev = [e for e in read_events(work / "run") if e["t"] > lost_at]
        alone = [e for e in ev if e["kind"] == "start" and e["world_size"] == 1]
        back = [e for e in ev if e["kind"] == "resume"]
        return back[0] if alone and back and steps_reached(work) >= back[0]["step"] + 10 else None

    resume = wait_for(f"the node left after {node}'s step was lost to resume alone and train 10 steps", resumed, 120,
                      slurm, work, job)
    assert resume["rank"] == 0 and resume["step"] >= saved, (resume, saved)
    assert slurm.job(job)["JobState"] == "RUNNING"
    log = (work / "out.log").read_text()
    assert "serving the rendezvous store" in log, "the store ran on the batch step"
    assert f"[rank 0] resumed from checkpoint step {resume['step']}" in log

    slurm.run("scancel", job)
    wait_for("the job to end", lambda: slurm.job(job)["JobState"] not in ("RUNNING", "COMPLETING"), 90, slurm, work)
    time.sleep(2)  # a requeue from the batch script would show up as PENDING now
    state = slurm.job(job)
    assert state["JobState"] == "CANCELLED" and state["Restarts"] == "0", state
    assert "stopping without requeue" in (work / "out.log").read_text()


class _EndingJob:
    """A Slurm stand-in: `job` answers RUNNING `running` times, then COMPLETED."""

    def __init__(self, running: int) -> None:
        self.running = running

    def job(self, job: str) -> dict[str, str]:
        self.running -= 1
        return {"JobState": "RUNNING" if self.running >= 0 else "COMPLETED", "Reason": "None"}

    def logs(self) -> str:
        return ""


def test_wait_for_sees_an_end_that_came_between_its_two_looks(tmp_path: Path) -> None:
    """The job COMPLETED after the predicate looked and before the state did: that is the awaited end, not
    a job that ended otherwise (this failed the keep-out test twice, reported as 'gave up after 300s')."""
    looks = iter([False, True])  # the job is still running at the first look, COMPLETED at the state's
    assert wait_for("the end", lambda: next(looks), 60, _EndingJob(0), tmp_path, job="1") is True  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match=r"gave up after \d+ of 60s .* states seen RUNNING/None -> COMPLETED/None"):
        wait_for("something else", lambda: False, 60, _EndingJob(1), tmp_path, job="1")  # type: ignore[arg-type]

