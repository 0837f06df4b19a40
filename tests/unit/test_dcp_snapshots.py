"""Zero-edit truth for scripts that checkpoint with torch.distributed.checkpoint themselves (shim/dcpsaves.py):
real DCP saves and loads (one process, no process group), real events files, the report built on them."""

from __future__ import annotations

import time
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from resctl.profile.schema import Profile
from resctl.shim import snapshots
from resctl.shim.runtime import Shim
from resctl.telemetry.events import read_run
from resctl.telemetry.goodput import analyze

pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy")


def shim(run: Path, rank: int = 0, cycle: int = 0) -> Shim:
    """A worker's shim with its tracker and its optimizer step hook (what counts steps), undone by `uninstall`."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    host = Shim(Profile(), run, env={"RANK": str(rank), "WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": str(cycle)})
    host.patches.on_undo(register_optimizer_step_post_hook(host.on_optimizer_step).remove)
    snapshots.install(host)
    return host


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


@pytest.fixture(autouse=True)
def quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DCP warns that it saves in a single process
        yield


def test_saves_are_counted_and_a_load_resumes_at_the_directorys_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = shim(run)
    try:
        model, opt = build()
        train(model, opt, 10)
        assert first.step == 10
        dcp.save({"model": model.state_dict()}, checkpoint_id=tmp_path / "step-10")
        train(model, opt, 10)
        msd, osd = get_state_dict(model, opt)
        pending = dcp.async_save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "step-20"))
        assert isinstance(pending, Future)
        pending.result()  # returns before the future's done callbacks run: the shim's undo settles them
    finally:
        first.uninstall()
    second = shim(run, cycle=1)
    try:
        model, opt = build()
        msd, osd = get_state_dict(model, opt)  # a fresh optimizer: DCP steps it once to make its state
        assert second.step == 0 and second.step_epoch is None, "DCP's state-making step was counted"
        state: dict[str, Any] = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=str(tmp_path / "step-20"))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert second.step == 20
        train(model, opt, 1)
        assert second.step == 21
        dcp.load({"model": model.state_dict()}, checkpoint_id=str(tmp_path / "step-10"))  # after a step: no resume
        assert second.step == 21
    finally:
        second.uninstall()
    ev = list(read_run(run))
    assert [(e["step"], e["path"], e.get("pending")) for e in ev if e["kind"] == "snapshot"] == [
        (10, str(tmp_path / "step-10"), None), (20, str(tmp_path / "step-20"), True)]
    assert [(e["kind"], e["step"]) for e in ev if e["kind"] in ("ckpt_stall", "ckpt_persist")] == [
        ("ckpt_stall", 20), ("ckpt_persist", 20)]
    assert [(e["step"], e["source"]) for e in ev if e["kind"] == "resume"] == [(20, "dcp.load")]
    report = analyze(ev)
    assert (report.snapshots, report.checkpoints) == (2, 2)


def test_resctls_own_sharded_saves_are_not_the_scripts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    host = shim(run)
    try:
        code = compile("dcp.save({'w': torch.ones(2)}, checkpoint_id=path)", "engine", "exec")
        exec(code, {"__name__": "resctl.checkpoint.sharded", "dcp": dcp, "torch": torch,
                    "path": str(tmp_path / "own")})
        dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "script"))
    finally:
        host.uninstall()
    assert [e["path"] for e in read_run(run) if e["kind"] == "snapshot"] == [str(tmp_path / "script")]


def test_only_local_directories(tmp_path: Path) -> None:
    from resctl.shim.dcpsaves import checkpoint_dir

    assert checkpoint_dir("s3://bucket/ckpt", None) is None
    assert checkpoint_dir(None, dcp.FileSystemWriter(str(tmp_path / "w"))) == str(tmp_path / "w")
    assert checkpoint_dir(tmp_path / "x", None) == str(tmp_path / "x")
    assert checkpoint_dir(None, object()) is None


def test_a_durable_async_save_is_recorded_even_when_the_worker_ends_before_its_callback(tmp_path: Path) -> None:
    """`Future.result()` returns once the result is set, before the done callbacks run in the writer's thread: a
    worker that ends right after it settles the save's `ckpt_persist` itself, and the late callback adds none."""
    import threading

    from resctl.shim import dcpsaves
    from resctl.telemetry.events import EventLog

    run = tmp_path / "run"
    events = EventLog(run, 0, 0)
    future: Future[None] = Future()
    gate = threading.Event()
    future.add_done_callback(lambda _: gate.wait(30))  # a callback ahead of the shim's, still running
    (tmp_path / "ck").mkdir()
    dcpsaves.staged(events, str(tmp_path / "ck"), 7, time.monotonic(), future)
    writer = threading.Thread(target=future.set_result, args=(None,))
    writer.start()
    future.result(timeout=30)  # the script's wait returns; the shim's callback has not run
    assert not any(e["kind"] == "ckpt_persist" for e in read_run(run))
    dcpsaves.settle()  # the worker's end
    gate.set()
    writer.join(30)
    assert [(e["kind"], e["step"]) for e in read_run(run) if e["kind"] == "ckpt_persist"] == [("ckpt_persist", 7)]


def test_a_worker_that_ends_while_the_callback_writes_waits_for_its_event(tmp_path: Path) -> None:
    """The other order (CI beside two CPU burners, 2026-12-08): the writer's thread had taken the save off the pending
    list and was writing its `ckpt_persist` when the worker ended; `settle` found nothing pending and returned, so the
    end came before the event. `settle` now returns only once that write is done."""
    import threading

    from resctl.shim import dcpsaves
    from resctl.telemetry.events import EventLog

    class HeldLog(EventLog):
        """Holds the writer's thread inside its `ckpt_persist` until released."""
        inside, release = threading.Event(), threading.Event()

        def emit(self, kind: str, **fields: Any) -> None:
            if kind == "ckpt_persist":
                self.inside.set()
                self.release.wait(30)
            super().emit(kind, **fields)

    run = tmp_path / "run"
    events = HeldLog(run, 0, 0)
    future: Future[None] = Future()
    (tmp_path / "ck").mkdir()
    dcpsaves.staged(events, str(tmp_path / "ck"), 7, time.monotonic(), future)
    writer = threading.Thread(target=future.set_result, args=(None,))
    writer.start()
    assert events.inside.wait(30), "the shim's callback never wrote"
    settled = threading.Thread(target=dcpsaves.settle)  # the worker's end, while the callback writes
    settled.start()
    settled.join(0.5)
    assert settled.is_alive(), "settle returned while the save's ckpt_persist was still being written"
    events.release.set()
    settled.join(30)
    writer.join(30)
    assert [(e["kind"], e["step"]) for e in read_run(run) if e["kind"] == "ckpt_persist"] == [("ckpt_persist", 7)]


@pytest.mark.parametrize("completed", [True, False])
def test_an_async_save_whose_future_never_finished_resumes_where_its_metadata_was_written(tmp_path: Path,
                                                                                         completed: bool) -> None:
    """A rank killed in the collective that ends `dcp.async_save` (after rank 0 wrote `.metadata`): rank 0's
    future fails, the others' wait, no `ckpt_persist` is ever written, yet the directory is a whole checkpoint
    that the restarted script loads (CI: a resume at step 15 went unrecorded, the report said final step 18).
    The load resumes at the save whose `.metadata` was written after it began; a `.metadata` older than the
    unfinished save (the same directory's earlier, durable save) resumes at that earlier save's step."""
    from resctl.shim import dcpsaves

    run, ck = tmp_path / "run", tmp_path / "ck"
    first = shim(run)
    try:
        model, opt = build()
        train(model, opt, 10)
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(ck))  # durable at step 10
        train(model, opt, 10)
        time.sleep(0.02)  # the next save begins after the first's `.metadata` (a coarse clock's tick)
        dcpsaves.staged(first.events, str(ck), first.step, time.monotonic(), Future())  # what the wrapper records
    finally:
        first.uninstall()
    if completed:  # the unfinished save's files and `.metadata` were written (by DCP, outside the record)
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(ck))
    second = shim(run, cycle=1)
    try:
        model, _ = build()
        dcp.load({"model": model.state_dict()}, checkpoint_id=str(ck))
        assert second.step == (20 if completed else 10)
    finally:
        second.uninstall()
    assert [(e["step"], e["source"]) for e in read_run(run) if e["kind"] == "resume"] == [
        (20 if completed else 10, "dcp.load")]
    # the save it resumed at was a checkpoint made: counted, though its future never finished (CI: 4 counted of 5)
    assert analyze(read_run(run)).snapshots == (2 if completed else 1)
