"""Zero-edit truth: the shim's torch.save/torch.load tracker, the snapshot ledger, and the report's
counts and fault attribution built on them (real torch.save files, real events files)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from resctl.profile.schema import Profile
from resctl.shim import snapshots as tracker_mod
from resctl.shim.runtime import Shim
from resctl.telemetry.events import read_run
from resctl.telemetry.goodput import KILLED, analyze


def shim(run: Path, rank: int = 0, cycle: int = 0) -> Shim:
    return Shim(Profile(), run, env={"RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": str(cycle)})


@pytest.fixture
def installed() -> Any:
    trackers: list[Any] = []
    yield trackers
    for t in reversed(trackers):
        t.shim.uninstall()


@pytest.mark.parametrize("chunk", [tracker_mod.CHUNK, 400], ids=["default", "small-chunks"])
def test_a_renamed_snapshot_is_recognised_after_a_restart(tmp_path: Path, installed: list[Any], chunk: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracker_mod, "CHUNK", chunk)  # the events are read in pieces of this size
    run, snap = tmp_path / "run", tmp_path / "snapshot.pt"
    first = shim(run)
    installed.append(tracker_mod.install(first))
    for step in (10, 20):
        first.step = step
        torch.save({"w": torch.ones(3) * step, "epoch": 1}, str(snap) + ".tmp")  # no "step" key
        os.replace(str(snap) + ".tmp", snap)
    first.step = 25
    installed.pop().shim.uninstall()

    second = shim(run, rank=1, cycle=1)  # another rank, the next launcher cycle
    installed.append(tracker_mod.install(second))
    assert torch.load(snap)["w"][0] == 20
    assert second.step == 20
    resumes = [e for e in read_run(run) if e["kind"] == "resume"]
    assert [(e["rank"], e["step"], e["source"], e["path"]) for e in resumes] == [(1, 20, "torch.load", str(snap))]
    written = [(e["step"], e["bytes"] > 0, e["file_id"] is not None) for e in read_run(run) if e["kind"] == "snapshot"]
    assert written == [(10, True, True), (20, True, True)]


def test_files_the_run_did_not_write_and_loads_after_training_began_change_nothing(
        tmp_path: Path, installed: list[Any]) -> None:
    run = tmp_path / "run"
    foreign = tmp_path / "pretrained.pt"
    torch.save({"step": 1000}, foreign)  # before the tracker: not this run's
    s = shim(run)
    installed.append(tracker_mod.install(s))
    torch.load(foreign)
    assert s.step == 0
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    s.step = 5
    torch.save({"m": model.state_dict()}, tmp_path / "mine.pt")
    model(torch.ones(2)).sum().backward()
    opt.step()  # this epoch has made a step: a later load is an evaluation, not a resume
    s.on_optimizer_step()  # the shim's step hook (Shim.install registers it; the tracker has none of its own)
    s.step = 6
    torch.load(tmp_path / "mine.pt")
    assert s.step == 6
    assert not [e for e in read_run(run) if e["kind"] == "resume"]


def ev(t: float, kind: str, rank: int = 0, cycle: int = 0, iteration: int = 0, **fields: Any) -> dict[str, Any]:
    return {"t": t, "kind": kind, "rank": rank, "cycle": cycle, "iteration": iteration, **fields}


def snapshot_run(*, intercepted: bool, kill: str) -> list[dict[str, Any]]:
    """2 ranks, a snapshot every 10 steps, rank 1 dies at step 25, the restart resumes from 20, 60 steps."""
    out = [ev(0.0, "start", r) for r in (0, 1)]
    t = 1.0
    for step in range(1, 26):
        t += 1.0
        for r in (0, 1):
            out.append(ev(t, "step", r, step=step, duration=1.0))
        if step % 10 == 0:
            out += saves(t, step, 0, intercepted)
    if kill == "drill":
        out.append(ev(t + 0.1, "fault", 1, cause="sigkill", injected=True, step=25, error="injected sigkill"))
    # rank 0's collective fails once its peer is gone; rank 1 (a real SIGKILL) wrote nothing more
    out.append(ev(t + 0.3, "fault", 0, cause="exception", step=25,
                  error="RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    out.append(ev(t + 0.4, "end", 0, status="error", step=25))
    t += 3.0
    for r in (0, 1):
        out += [ev(t, "start", r, 1), ev(t, "restart", r, 1, layer="launcher"),
                ev(t + 0.5, "resume", r, 1, step=20, source="torch.load", path="/s/snapshot.pt")]
    t += 0.5
    for step in range(21, 61):
        t += 1.0
        for r in (0, 1):
            out.append(ev(t, "step", r, 1, step=step, duration=1.0))
        if step % 10 == 0:
            out += saves(t, step, 1, intercepted)
    return out


def saves(t: float, step: int, cycle: int, intercepted: bool) -> list[dict[str, Any]]:
    path = "/s/snapshot.pt"
    if not intercepted:
        return [ev(t + 0.2, "snapshot", 0, cycle, step=step, path=path, seconds=0.2, bytes=100, file_id=f"1:{step}")]
    # the interceptor's step is unknown (null); its persist may come before the snapshot record
    return [ev(t + 0.01, "ckpt_stall", 0, cycle, step=None, seconds=0.01, waited=0.0, path=path),
            ev(t + 0.015, "ckpt_persist", 0, cycle, step=None, seconds=0.004, bytes=100, path=path),
            ev(t + 0.02, "snapshot", 0, cycle, step=step, path=path, seconds=0.02, pending=True)]


@pytest.mark.parametrize("intercepted", [False, True], ids=["observed", "intercepted"])
@pytest.mark.parametrize("kill", ["drill", "kill -9"])
def test_report_of_a_snapshot_job(intercepted: bool, kill: str) -> None:
    a = analyze(snapshot_run(intercepted=intercepted, kill=kill))
    assert (a.final_step, a.kept_steps, a.steps_run) == (60, 60, 65)
    (r,) = a.recoveries
    assert (r.resumed_step, r.last_step, r.rollback_steps, r.layer) == (20, 25, 5, "launcher")
    assert (r.cause, r.rank) == (("sigkill", 1) if kill == "drill" else (KILLED, 1))
    assert a.checkpoints == a.snapshots == 6
    c = a.calibration
    assert c.interval_steps == 10 and c.saves == 6  # 10, 20 before the kill, 30..60 after
    assert c.write is not None and c.write > 0
    assert c.async_ is (None if intercepted else False)


def test_a_genuine_error_beats_the_rank_it_took_down() -> None:
    """rank 0 raises a real error; rank 1, stuck in a collective, is killed by the launcher without a record."""
    out = [ev(0.0, "start", r) for r in (0, 1)] + [ev(1.0 + s, "step", r, step=s, duration=1.0)
                                                   for s in range(1, 6) for r in (0, 1)]
    out += [ev(6.5, "fault", 0, cause="exception", step=5, error="ValueError: bad batch"),
            ev(6.6, "end", 0, status="error", step=5),
            ev(9.0, "start", 0, 1), ev(9.0, "start", 1, 1), ev(10.0, "step", 0, 1, step=1, duration=1.0)]
    (r,) = analyze(out).recoveries
    assert (r.cause, r.rank) == ("exception", 0)


def test_the_failure_summary_names_the_rank_that_died_without_a_record(tmp_path: Path) -> None:
    import json

    from resctl.telemetry.summary import failure_summary

    records = {0: [ev(0.0, "start", 0), ev(1.0, "step", 0, step=1, duration=1.0),
                   ev(2.0, "fault", 0, cause="exception", error="RuntimeError: Connection closed by peer"),
                   ev(2.1, "end", 0, status="error")],
               1: [ev(0.0, "start", 1), ev(1.0, "step", 1, step=1, duration=1.0)]}
    for rank, rows in records.items():
        (tmp_path / f"events-rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = "\n".join(failure_summary(tmp_path, 1))
    assert "rank 1 ended without a record" in text and "Connection closed by peer (rank 0)" in text


def test_a_final_torch_save_does_not_calibrate_a_resctl_checkpoint_job() -> None:
    out = [ev(0.0, "start", 0)]
    for step in range(1, 31):
        out.append(ev(float(step), "step", 0, step=step, duration=1.0))
        if step % 5 == 0:
            out += [ev(step + 0.1, "ckpt_stall", 0, step=step, seconds=0.1, waited=0.0),
                    ev(step + 0.6, "ckpt_persist", 0, step=step, seconds=0.5, bytes=10)]
    out.append(ev(31.0, "snapshot", 0, step=30, path="/out/final.pt", seconds=9.0, bytes=999, file_id="1:2:3:4"))
    c = analyze(out, {"profile": {"checkpoint": {"interval_steps": 5, "async": True}}}).calibration
    assert (c.saves, c.write, c.stall, c.interval_steps, c.async_) == (6, 0.5, pytest.approx(0.1), 5, True)
