"""Recovery drills end to end: real ft_launcher, real gloo workers, injected faults.

A fault-free run of examples/train_ckpt.py is the reference; a run with five injected faults
(exception, SIGKILL, hang, a failed checkpoint write, and a fault right after a restart) must end
with a model *and* optimizer state bitwise equal to it and exit 0 — with in-process restart off
(every fault is an in-job restart by ft_launcher) and on (exceptions, hangs and write failures
restart in-process; the SIGKILL falls through to the launcher).

Timeouts are short so the whole module runs in a few minutes on a 2-core box.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from resctl.telemetry.goodput import analyze
from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, last_step, start, wait_for

pytestmark = pytest.mark.slow
TRAIN = str(EXAMPLES / "train_ckpt.py")
STEPS = 30

# Steps are chosen against checkpoint.interval_steps = 5 (each fault replays from the last multiple
# of 5), and so that "right after a restart" is real: the sigkill at 12 resumes from 10 (from 5 when
# the asynchronous write of 10 was still in flight: resumes_after_kill), and the
# hang at 13 is the first new step after the replay. The checkpoint_exception at 17 fails the write
# of step 20: a failed save is reported (ckpt_fail) and retried at the next interval (25), with no
# restart (checkpoint.max_failed_saves, default 3, bounds the failures in a row).
FIVE_FAULTS = "exception@8:1,sigkill@12:0,hang@13:1,checkpoint_exception@17:0"
SECOND_FAULT_AFTER_RESTART = "exception@14:0"

# soft_timeout also fires on a main thread blocked in C that long (NVRx's automatic progress stamp): a rank
# waiting in init_process_group for slower peers. 5s did on a loaded box, once in three runs of the 4-rank drill
# beside two others and two CPU burners: after the launcher's restart the first rank in waited 6 s for the rest,
# its wrapper aborted the new group and every rank restarted in-process once more (an unplanned recovery; CI
# saw an extra launcher cycle as well). 10s doubles the margin; only the hang at step 13 waits it out.
IN_PROCESS = [
    "inprocess.enabled=true", "inprocess.soft_timeout=10s", "inprocess.hard_timeout=15s",
    "inprocess.barrier_timeout=25s", "inprocess.heartbeat_timeout=10s", "inprocess.monitor_interval=0.5s",
    "inprocess.progress_interval=0.5s", "inprocess.last_call_wait=0.1s", "inprocess.termination_grace_time=1s",
]


def job(tmp: Path, name: str, nproc: int, *, inprocess: bool = False, sets: tuple[str, ...] = (),
        steps: int = STEPS, step_time: float = 0.03) -> list[str]:
    overrides = [f"checkpoint.dir={tmp / (name + '-ckpt')}", "checkpoint.interval_steps=5",
                 # The launcher's hang detection: well above a step, below the test's patience. With
                 # in-process on, it must also outlast the in-process layer's worst case, or the rank
                 # monitors kill ranks that in-process restart was still recovering (an extra launcher
                 # cycle): a fault right after a restart can wait out inprocess.barrier_timeout (15s)
                 # on a loaded box, after soft_timeout (5s) for a hang. 12s did, once in a while
                 # ("Did not get subsequent heartbeat. Waited 12.00 seconds" on both ranks 12 s after
                 # the exception at step 14), and 25s outlasted the 15s barrier and 5s soft timeout then
                 # used. Faults here are seen by soft_timeout and process exits, never by this timeout, so
                 # a longer one costs no time.
                 f"heartbeat.timeout={'40s' if inprocess else '4s'}", "heartbeat.check_interval=1s",
                 "launch.max_restarts=6", *sets]
    if inprocess:
        # The default min_world_size (every rank) hands a lost rank over to the launcher: a shrunken
        # world would change the arithmetic.
        overrides += IN_PROCESS
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", str(nproc), "--run-dir", str(tmp / name)]
    for item in overrides:
        args += ["--set", item]
    return [*args, TRAIN, "--steps", str(steps), "--step-time", str(step_time), "--out", str(tmp / f"{name}.pt")]


def run(args: list[str], cwd: Path, faults: str = "", timeout: float = 360) -> str:
    """Run a job to its end. The patience is ~12x the drill's 29 s on an idle 2-core box: CI once gave the
    4-rank drill (five cycles of four workers importing torch, beside two other tests' jobs) more than 150 s."""
    env = {"RESCTL_FAULTS": faults} if faults else {}
    try:
        code, out = finish(start(args, cwd=cwd, env=env), timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_where(cwd / args[args.index('--run-dir') + 1])}") from None
    assert code == 0, out[-4000:]
    return out


def _where(run_dir: Path) -> str:
    """Where a job stood when it was given up on: its last events and the launcher log's last lines."""
    ev = [f"{e['t']:.1f} {e['kind']} rank {e.get('rank')} cycle {e.get('cycle')} step {e.get('step')}"
          for e in events(run_dir)[-25:]]
    log = run_dir / "launcher.log"
    tail = log.read_text(errors="replace").splitlines()[-25:] if log.exists() else ["(no launcher.log)"]
    return "--- last events\n" + "\n".join(ev) + "\n--- launcher.log, end\n" + "\n".join(tail)


def assert_bitwise_equal(a: Any, b: Any, path: str = "state") -> None:
    assert type(a) is type(b), path
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_bitwise_equal(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_bitwise_equal(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
    else:
        assert a == b, path


def assert_same_final(got: Path, want: Path) -> None:
    assert_bitwise_equal(torch.load(got, weights_only=True), torch.load(want, weights_only=True))


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """Fault-free final states for 2 and 4 ranks (in-process off)."""
    tmp = tmp_path_factory.mktemp("recovery-ref")
    out = {}
    for nproc in (2, 4):
        run(job(tmp, f"ref{nproc}", nproc), cwd=tmp)
        out[nproc] = tmp / f"ref{nproc}.pt"
        # Issue 27: the pruned checkpoint kept for the next write to overwrite is not left behind.
        assert not list((tmp / f"ref{nproc}-ckpt").glob(".recycle-*")), "a whole old checkpoint left hidden"
    return out


def injected(run_dir: Path) -> list[str]:
    return sorted(f"{e['cause']}@{e['step']}:{e['rank']}" for e in events(run_dir)
                  if e["kind"] == "fault" and e.get("injected"))


def unplanned(run_dir: Path) -> list[str]:
    """The faults no drill injected (a rank's error, seen where a recovery was not planned): for failure messages."""
    return [f"cycle {e['cycle']} iteration {e.get('iteration')} rank {e['rank']} step {e.get('step')}: {e.get('error')}"
            for e in events(run_dir) if e["kind"] == "fault" and not e.get("injected")]


def resumes_after_kill(ev: list[dict[str, Any]]) -> set[int]:
    """The steps the SIGKILL at step 12 may resume from: 10 when the write of step 10 was recorded durable
    before rank 0 recorded the fault; else 5 or 10. Step 10's save is asynchronous and the kill comes two
    steps (60 ms) later: on a loaded box the write can still be in flight (CI saw a resume from 5), or be
    durable with its `ckpt_persist` record still in the killed rank's event buffer (seen beside CPU
    burners: a resume from 10 with no record of it). An exception or a hang gives the write time to finish
    (the shim waits for the save in flight), so only this fault varies."""
    kill = next(e for e in ev if e["kind"] == "fault" and e["cause"] == "sigkill")
    recorded = any(e["kind"] == "ckpt_persist" and e.get("step") == 10 and e["t"] <= kill["t"] for e in ev)
    return {10} if recorded else {5, 10}


INPROCESS_04 = pytest.mark.nvrx_series("0.4")  # in-process restart: NVRx 0.4 only (docs/recovery.md, issue 30)


@pytest.mark.parametrize("nproc,inprocess", [(2, False), pytest.param(2, True, marks=INPROCESS_04), (4, False),
                                             pytest.param(4, True, marks=INPROCESS_04)],
                         ids=["2ranks-injob", "2ranks-inprocess", "4ranks-injob", "4ranks-inprocess"])
def test_five_faults_end_bitwise_equal_to_a_fault_free_run(
    tmp_path: Path, references: dict[int, Path], nproc: int, inprocess: bool
) -> None:
    faults = f"{FIVE_FAULTS},{SECOND_FAULT_AFTER_RESTART}"
    faults = faults.replace(":1", f":{nproc - 1}")  # the last rank, whatever the size
    out = run(job(tmp_path, "drill", nproc, inprocess=inprocess), cwd=tmp_path, faults=faults)
    run_dir = tmp_path / "drill"
    assert len(injected(run_dir)) == 5, injected(run_dir)
    ev = events(run_dir)
    cycles = {e["cycle"] for e in ev if e["kind"] == "start"}
    inproc_restarts = {(e["cycle"], e["iteration"]) for e in ev if e["kind"] == "restart" and e.get("layer") == "inprocess"}
    if inprocess:
        # Only the SIGKILL needs the launcher; everything else restarted inside the processes.
        assert cycles == {0, 1}, (cycles, unplanned(run_dir))
        assert len(inproc_restarts) >= 3, inproc_restarts
    else:
        assert len(cycles) == 5 and not inproc_restarts, (cycles, inproc_restarts)
    failed = [(e["rank"], e["step"]) for e in ev if e["kind"] == "ckpt_fail"]
    assert failed == [(0, 20)], failed  # the failed write of step 20, survived: the save of 25 retried
    assert_same_final(tmp_path / "drill.pt", references[nproc])
    # `resctl report` of the same run agrees with the schedule: one recovery per fault that needs one,
    # each by the layer that should take it, resumed from the newest durable checkpoint (a multiple of
    # 5), rolled back from the step the fault hit.
    report = analyze(ev)
    last = nproc - 1
    got = [(r.cause, r.rank, r.last_step, r.resumed_step) for r in report.recoveries]
    allowed = resumes_after_kill(ev)
    after_kill = got[1][3] if len(got) == 4 and got[1][3] in allowed else max(allowed)
    want = [("exception", last, 8, 5), ("sigkill", 0, 12, after_kill), ("hang", last, 13, 10), ("exception", 0, 14, 10)]
    assert got == want, (got, allowed, unplanned(run_dir))
    assert [r.rollback_steps for r in report.recoveries] == [3, 12 - after_kill, 3, 4]
    layers = [r.layer for r in report.recoveries]
    assert layers == (["inprocess", "launcher", "inprocess", "inprocess"] if inprocess else ["launcher"] * 4)
    for r in report.recoveries:
        assert r.injected and r.total is not None and r.total > 0
        # The report's phases add up to the restart; a launcher restart knows when its workers were
        # created (`start`'s spawned), so it splits the rendezvous from the workers' start.
        assert (r.stop or 0.0) + (r.rendezvous or 0.0) + (r.start_workers or 0.0) == pytest.approx(r.restart)
        assert (r.start_workers is not None) == (r.layer == "launcher")
    # each restarted cycle's workers carry the launcher's clock of that restart: failure seen, workers stopped,
    # before the new start
    restarted = [e for e in ev if e["kind"] == "start" and e["cycle"] > 0]
    assert restarted and all(e["detected"] <= e["stopped"] <= e["t"] for e in restarted), restarted
    # the console: one line per recovered fault, of either layer
    said = [line for line in out.splitlines() if line.startswith("resctl: ")]
    by_launcher = [line for line in said if "restarting the workers" in line]
    in_place = [line for line in said if "re-run the script in place" in line]
    assert len(by_launcher) == layers.count("launcher") and len(in_place) == layers.count("inprocess"), said
    assert by_launcher[0].endswith("5 of 6 restarts left (details: launcher.log in the run directory)"), by_launcher


@pytest.mark.nvrx_series("0.4")  # in-process restart: NVRx 0.4 only (docs/recovery.md, issue 30)
def test_sigkill_falls_through_to_the_launcher_with_inprocess_on(tmp_path: Path, references: dict[int, Path]) -> None:
    run(job(tmp_path, "kill", 2, inprocess=True), cwd=tmp_path, faults="sigkill@9:1")
    starts = [e for e in events(tmp_path / "kill") if e["kind"] == "start"]
    assert {e["cycle"] for e in starts} == {0, 1}
    assert_same_final(tmp_path / "kill.pt", references[2])


def test_intercepted_torch_save_recovers_an_unmodified_script_after_sigkill(tmp_path: Path) -> None:
    """examples/train_snapshot.py keeps its own snapshot.pt with torch.save; with the glob set,
    those saves become async atomic checkpoints, and a SIGKILL drill still ends bitwise equal."""
    script = str(EXAMPLES / "train_snapshot.py")

    def args(name: str) -> list[str]:
        return ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp_path / name),
                "--set", "checkpoint.intercept_torch_save=*snapshot.pt", "--set", f"checkpoint.dir={tmp_path / (name + '-ckpt')}",
                script, "--steps", "30", "--step-time", "0.02", "--snapshot", str(tmp_path / f"{name}-snapshot.pt"),
                "--out", str(tmp_path / f"{name}.pt")]

    run(args("ref"), cwd=tmp_path)
    out = run(args("kill"), cwd=tmp_path, faults="sigkill@17:0")
    assert "resumed from" in out
    assert {e["cycle"] for e in events(tmp_path / "kill") if e["kind"] == "start"} == {0, 1}
    want, got = torch.load(tmp_path / "ref.pt", weights_only=True), torch.load(tmp_path / "kill.pt", weights_only=True)
    assert_bitwise_equal(got, want)


def test_sigterm_writes_a_final_checkpoint_at_the_latest_step(tmp_path: Path) -> None:
    from resctl.checkpoint import format as fmt

    ckpt = tmp_path / "term-ckpt"
    args = job(tmp_path, "term", 2, steps=400, step_time=0.05,
               sets=("checkpoint.interval_steps=1000", "checkpoint.save_on_sigterm=true", "checkpoint.sigterm_grace=10s"))
    args = [a.replace("checkpoint.interval_steps=5", "checkpoint.interval_steps=1000") for a in args]
    proc = start(args, cwd=tmp_path)
    run_dir = tmp_path / "term"
    wait_for(lambda: last_step(run_dir, 0) >= 15, 120, "rank 0 to reach step 15", proc)
    os.kill(proc.pid, signal.SIGTERM)  # the resctl process: it forwards to ft_launcher
    code, out = finish(proc, timeout=60)
    assert code != 0, "a preempted job does not report success"
    saved = [(s, p) for s, p in fmt.list_step_dirs(ckpt) if (p / fmt.MANIFEST).exists()]
    assert saved, f"no final checkpoint in {ckpt}:\n{out[-3000:]}"
    newest = saved[0][0]
    assert newest == last_step(run_dir, 0), (newest, last_step(run_dir, 0))
    assert not list(ckpt.glob(".recycle-*")), "a pruned checkpoint kept for reuse is removed at the end"
    assert newest >= 15
    # And it loads: a fresh Checkpointer restores it.
    from resctl.checkpoint import Checkpointer

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    state = {"model": model, "optim": torch.optim.Adam(model.parameters())}
    assert Checkpointer(dir=ckpt).load(state) == newest
