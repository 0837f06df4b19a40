"""Rollbacks of the memory tier under kill -9 at random moments (issue 27, item 4).

With `checkpoint.memory_every = 1` a kill mid-snapshot used to leave no step that both ranks held
(rank 0 {22, 23}, rank 1 {21}: commits finish on each rank's own time), and a kill right after one
rank finished cleanly found that rank's snapshots deleted; both resumed from step 0. Now the step
that ends in the next snapshot does not start before the previous snapshot is committed
(back-pressure, memory.MemoryTier.hold_if_committing: at `memory_every = 1` every step), and
snapshots stay until the job as a whole is done. The bound (issue 31) is `memory_every` + the
steps a commit spans, capped at 2 memory_every - 1; `memory_every` at `memory_every = 1`, and
memory_every + 1 with commits shorter than a step (rollback_pair.py with commits stretched over
many steps, and with commits as short as they are).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from resctl.checkpoint import memdir
from resctl.telemetry.events import read_events
from resctl.telemetry.goodput import analyze
from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, start, wait_for

STEPS = 400


def job(tmp: Path, name: str, steps: int = STEPS) -> list[str]:
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp / name)]
    for item in (f"checkpoint.dir={tmp / (name + '-ckpt')}", "checkpoint.interval_steps=100000",
                 "checkpoint.memory_every=1", "heartbeat.timeout=20s", "launch.max_restarts=20"):
        args += ["--set", item]
    return [*args, str(EXAMPLES / "train_ckpt.py"), "--steps", str(steps), "--step-time", "0.01", "--width", "64"]


def kill_randomly(run_dir: Path, proc: object, kills: int, rng: random.Random) -> None:
    """`kills` times: once the current cycle trained a few steps, SIGKILL a random rank at a random moment."""
    for cycle in range(kills):
        def trained(c: int = cycle) -> bool:
            ev = [e for e in events(run_dir) if e["cycle"] == c]
            return sum(e["kind"] == "step" for e in ev) >= 6 and {e["rank"] for e in ev if e["kind"] == "start"} == {0, 1}

        wait_for(trained, 240, f"cycle {cycle} to train", proc)  # type: ignore[arg-type]
        time.sleep(rng.uniform(0, 0.3))
        rank = rng.randrange(2)
        pid = next(e["pid"] for e in events(run_dir) if e["kind"] == "start" and e["cycle"] == cycle and e["rank"] == rank)
        os.kill(pid, signal.SIGKILL)


def recoveries(run_dir: Path) -> list[tuple[int, int, str | None]]:
    return [(r.last_step, r.rollback_steps, r.tier) for r in analyze(read_events(run_dir)).recoveries]


@pytest.mark.slow
@pytest.mark.nvrx_independent
def test_random_kills_roll_back_at_most_memory_every_steps(tmp_path: Path) -> None:
    run_dir = tmp_path / "kills"
    proc = start(job(tmp_path, "kills"), cwd=tmp_path)
    kill_randomly(run_dir, proc, 4, random.Random(27))
    code, out = finish(proc, timeout=600)
    assert code == 0, out[-3000:]
    found = recoveries(run_dir)
    assert len(found) == 4, found
    assert all(rollback <= 1 and tier == "memory" for _, rollback, tier in found), found


def run_pair(tmp: Path, every: int, kills: int, seed: int, delay: float | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    pair = Path(__file__).with_name("rollback_pair.py")
    args = [sys.executable, str(pair), str(tmp), "--every", str(every), "--kills", str(kills), "--seed", str(seed)]
    if delay is not None:
        args += ["--delay", str(delay)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(lines) == kills + 1, proc.stdout
    return lines[:-1], lines[-1]


@pytest.mark.slow
@pytest.mark.nvrx_independent
def test_kill_9_mid_commit_with_memory_every_3_rolls_back_at_most_2_memory_every_minus_1(tmp_path: Path) -> None:
    """Two real ranks, each commit stretched over many steps (as a GPU's is), SIGKILLed at 8
    random moments: every restart resumes at most `memory_every` + (memory_every - 1) steps (the
    commit spans more than the steps between snapshots, so the back-pressure hold caps it) behind
    the newest step any rank finished, from a state that is that step's (rollback_pair.py checks
    the restore), and never from nothing once the first commit must have landed."""
    every = 3
    in_commit, seen = 0, []
    # The kills fall at random moments: on a loaded box fewer may land inside a commit (1 of 8 beside two CPU
    # burners, 2026-12-04). Another job of 8 kills, up to three in all, until two have: the bound is asserted
    # on every kill of every job.
    for seed in (2027, 2028, 2029):
        (tmp_path / str(seed)).mkdir()
        kills, summary = run_pair(tmp_path / str(seed), every, 8, seed)
        assert all(k["reached"] - k["resumed"] <= every + min(k["span"], every - 1) <= 2 * every - 1 for k in kills), kills
        # From memory (no disk checkpoints in this job), never from nothing once a commit must have landed: the
        # back-pressure hold at step 2 * every waits for the first snapshot's commit. A kill before that (the
        # first commit still in flight: seen in CI beside CPU burners, killed at step 5) has nothing to resume from.
        assert all(k["resumed"] > 0 for k in kills if k["reached"] >= 2 * every), kills
        in_commit += summary["in_commit"]
        seen += kills
        if in_commit >= 2:
            break
    assert in_commit >= 2, f"fewer than 2 kills landed while a commit was in flight: {seen}"


@pytest.mark.slow
@pytest.mark.nvrx_independent
def test_kill_9_with_commits_shorter_than_a_step_rolls_back_memory_every_plus_the_steps_spanned(tmp_path: Path) -> None:
    """The same pair with commits as short as they are (microseconds here, less than a step):
    the bound is `memory_every` + 1 (+ the steps a commit spanned on a loaded box, measured)."""
    every = 3
    kills, _ = run_pair(tmp_path, every, 8, 31, delay=0.0)
    # A kill before the first commit resumes from 0 (the start): within the bound too, and right.
    assert all(0 <= k["resumed"] and k["reached"] - k["resumed"] <= every + min(k["span"], every - 1) for k in kills), kills
    # Commits shorter than a step (span 1: the bound every + 1) in at least one kill; how many depends on the
    # box's load (4 of 8 asserted once; 2 of 8 beside two CPU burners and a second suite), not on resctl.
    assert any(k["span"] == 1 for k in kills), kills


def test_a_rank_that_finished_cleanly_keeps_its_snapshots_under_resctl_run(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The other rank may still be killed: its restart needs this rank's state (the launcher's
    backstop removes it when the job is over). Without `resctl run` nobody else would: removed."""
    from resctl.checkpoint.engine import Checkpointer
    from resctl.profile.schema import Profile
    from resctl.shim.runtime import Shim
    from tests.unit.test_checkpoint import _training

    monkeypatch.setenv(memdir.SHM_ENV, str(tmp_path / "shm"))
    for launch, kept in (("p1-00ff", True), ("", False)):
        if launch:
            monkeypatch.setenv(memdir.LAUNCH_ENV, launch)
        else:
            monkeypatch.delenv(memdir.LAUNCH_ENV, raising=False)
        shim = Shim(Profile(), None, env={"RANK": "0", "WORLD_SIZE": "1"})
        shim.checkpointer = Checkpointer(dir=tmp_path / f"ck{launch}", interval_steps=100, memory_every=1,
                                         run_id="r", async_=False)
        for step, state in _training(range(1, 4)):
            shim.checkpointer.maybe_save(state, step)
        shim.checkpointer.wait()
        rank = memdir.rank_dir(memdir.job_key("r", ""), 0)
        assert rank.is_dir()
        shim.finish("ok")
        assert rank.is_dir() == kept, (launch, list(rank.parent.iterdir()) if rank.parent.exists() else None)
