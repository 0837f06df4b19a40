"""resctl.checkpoint engine: real files, real threads, no timing assertions."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

import resctl.checkpoint as api
from resctl.checkpoint import disk
from resctl.checkpoint import format as fmt
from resctl.checkpoint.engine import Checkpointer, CheckpointError
from resctl.telemetry.events import EventLog, read_events


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def _trained(seed: int = 0, steps: int = 3) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = _model()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
    return model, optim


def _training(steps: range) -> Iterator[tuple[int, dict[str, Any]]]:
    """A small model and AdamW (`_trained`, seed 1, one step) trained one more step per item of
    `steps`; yields (step, state) after each, the state's `extra` naming the step."""
    model, optim = _trained(seed=1, steps=1)
    state: dict[str, Any] = {"model": model, "optim": optim, "extra": {"note": "x"}}
    for step in steps:
        model(torch.randn(4, 16)).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
        state["extra"] = {"note": "x", "step": step}
        yield step, state


def _fresh() -> dict[str, Any]:
    torch.manual_seed(123)
    model = _model()
    return {"model": model, "optim": torch.optim.AdamW(model.parameters(), lr=1e-2), "extra": None}


def _assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        # Compare bytes, so NaN payloads and -0.0 count too (bitwise equality).
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b


def _visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def _ckpt(tmp_path: Path, **kw: Any) -> Checkpointer:
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    return Checkpointer(dir=tmp_path / "ck", **kw)


@pytest.mark.parametrize("async_", [True, False])
def test_roundtrip_model_and_optimizer_bitwise(tmp_path: Path, async_: bool) -> None:
    model, optim = _trained()
    extra = {"epoch": 7, "rng": torch.get_rng_state(), "bf16": torch.randn(5, 3).to(torch.bfloat16), "empty": torch.empty(0)}
    ck = _ckpt(tmp_path, async_=async_, writers=3)
    ck.save({"model": model, "optim": optim, "extra": extra}, 42)
    ck.wait()

    state = _fresh()
    assert ck.load(state) == 42
    _assert_same(model.state_dict(), state["model"].state_dict())
    _assert_same(optim.state_dict(), state["optim"].state_dict())
    _assert_same(extra, state["extra"])
    ck.close()


def test_load_without_checkpoint_returns_zero(tmp_path: Path) -> None:
    state = _fresh()
    assert _ckpt(tmp_path).load(state) == 0
    assert state["extra"] is None


def test_multi_file_split_roundtrip(tmp_path: Path) -> None:
    # Large enough that the stream is cut into several data files.
    big = {"a": torch.randn(3 << 20), "b": torch.arange(5 << 20, dtype=torch.int64), "c": torch.randn(7)}
    ck = _ckpt(tmp_path, writers=4)
    ck.save({"big": big}, 1)
    ck.wait()
    names = sorted(p.name for p in (tmp_path / "ck" / "step-000000001").iterdir())
    assert len([n for n in names if n.startswith("data-")]) == 4
    state: dict[str, Any] = {"big": None}
    assert ck.load(state) == 1
    _assert_same(big, state["big"])


def test_keep_last_prunes_older(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path, keep_last=2)
    for step in (10, 20, 30, 40):
        ck.save({"x": torch.full((4,), float(step))}, step)
    ck.wait()
    visible = sorted(p.name for p in (tmp_path / "ck").iterdir() if not p.name.startswith("."))
    assert visible == ["step-000000030", "step-000000040"]
    assert len(_hidden(tmp_path / "ck", ".")) <= 1  # at most one pruned checkpoint kept for recycling


def test_a_publish_waits_for_the_previous_prune(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Async saves whose prune thread lags (a loaded node): the next checkpoint is published only once the
    previous save's prune is done, so a kill at any moment leaves at most keep_last + 1 visible (a CI run
    at load 15 found keep_last + 2)."""
    import threading

    armed, release, pruning = threading.Event(), threading.Event(), threading.Event()
    prune = disk.Disk.prune

    def held(self: disk.Disk, recycle: bool = True) -> int:
        if armed.is_set():
            pruning.set()
            assert release.wait(60)
        return prune(self, recycle)

    monkeypatch.setattr(disk.Disk, "prune", held)
    ck = _ckpt(tmp_path, keep_last=2, async_=True)
    for step in (1, 2, 3):
        ck.save({"x": torch.full((4,), float(step))}, step)
    ck.wait()
    armed.set()
    ck.save({"x": torch.full((4,), 4.0)}, 4)  # published: 2, 3, 4 visible; its prune holds
    assert pruning.wait(60)
    ck.save({"x": torch.full((4,), 5.0)}, 5)  # written, then waits for step 4's prune
    time.sleep(0.5)
    visible = [s for s, _ in fmt.list_step_dirs(tmp_path / "ck")]
    release.set()
    ck.wait()
    assert sorted(visible) == [2, 3, 4], visible
    assert sorted(s for s, _ in fmt.list_step_dirs(tmp_path / "ck")) == [4, 5]


def test_keep_last_holds_when_every_restart_saves_once(tmp_path: Path) -> None:
    # A job killed after each restart's first save (seen in CI: 5 checkpoints kept with keep_last=2):
    # a process verifies only the one it loaded, so the older ones must go once it has keep_last.
    step = 0
    for _ in range(5):
        ck = _ckpt(tmp_path, keep_last=2)
        state: dict[str, Any] = {"x": None}
        assert ck.load(state) == step
        step += 1
        ck.save({"x": torch.full((4,), float(step))}, step)
        ck.wait()
        ck.close()
    visible = sorted(p.name for p in (tmp_path / "ck").iterdir() if not p.name.startswith("."))
    assert visible == ["step-000000004", "step-000000005"]


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_file_is_skipped_and_previous_loads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    events = EventLog(run, rank=0)
    ck = _ckpt(tmp_path, keep_last=3, events=events)
    for step in (1, 2):
        ck.save({"x": torch.full((1000,), float(step))}, step)
    ck.wait()
    _flip_byte(tmp_path / "ck" / "step-000000002" / "data-0.bin", 17)

    state: dict[str, Any] = {"x": None}
    assert ck.load(state) == 1
    assert torch.equal(state["x"], torch.full((1000,), 1.0))
    skips = [e for e in read_events(run) if e["kind"] == "ckpt_skip"]
    assert [e["step"] for e in skips] == [2] and "checksum" in skips[0]["reason"]
    kinds = {e["kind"] for e in read_events(run)}
    assert {"ckpt_stall", "ckpt_persist"} <= kinds


def test_corrupt_manifest_and_truncated_file_are_skipped(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path, keep_last=5)
    for step in (1, 2, 3):
        ck.save({"x": torch.full((1000,), float(step))}, step)
    ck.wait()
    root = tmp_path / "ck"
    manifest = root / "step-000000003" / fmt.MANIFEST
    manifest.write_text(manifest.read_text().replace('"step": 3', '"step": 4'))
    data = root / "step-000000002" / "data-0.bin"
    data.write_bytes(data.read_bytes()[:-10])
    state: dict[str, Any] = {"x": None}
    assert ck.load(state) == 1


def test_incomplete_checkpoint_is_skipped(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path)
    ck.save({"x": torch.ones(10)}, 5)
    ck.wait()
    root = tmp_path / "ck"
    # A writer killed before its manifest: a step directory without one (and a leftover temp dir).
    (root / "step-000000009").mkdir()
    (root / "step-000000009" / "data-0.bin").write_bytes(b"\0" * 64)
    (root / ".tmp-step-000000010-1-abcd").mkdir()
    state: dict[str, Any] = {"x": None}
    assert ck.load(state) == 5
    # The first save of the next process cleans up temp directories left behind.
    ck2 = _ckpt(tmp_path)
    ck2.save({"x": torch.ones(10)}, 6)
    ck2.wait()
    assert not (root / ".tmp-step-000000010-1-abcd").exists()


class Evil:
    """Unpickling this would create a marker file: weights_only loading must never do that."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def test_pickled_object_refused_at_save(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path)
    with pytest.raises(TypeError, match="weights_only"):
        ck.save({"x": Evil(str(tmp_path / "marker"))}, 1)


def test_pickled_object_in_checkpoint_is_skipped(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path, keep_last=5)
    ck.save({"x": torch.ones(3)}, 1)
    ck.save({"x": torch.ones(3) * 2}, 2)
    ck.wait()
    # Forge step 2: meta.pt holds a pickled arbitrary object, and the manifest's checksums match.
    step2 = tmp_path / "ck" / "step-000000002"
    marker = tmp_path / "marker"
    import io

    buf = io.BytesIO()
    torch.save({"step": 2, "entries": {"x": Evil(str(marker))}, "stateful": []}, buf)
    (step2 / fmt.META).write_bytes(buf.getvalue())
    manifest = fmt.read_manifest(step2 / fmt.MANIFEST)
    files = {**manifest.files, fmt.META: fmt.FileEntry(len(buf.getvalue()), zlib.crc32(buf.getvalue()))}
    os.unlink(step2 / fmt.MANIFEST)
    fmt.write_manifest(step2 / fmt.MANIFEST, dataclasses.replace(manifest, files=files))

    state: dict[str, Any] = {"x": None}
    assert ck.load(state) == 1
    assert torch.equal(state["x"], torch.ones(3))
    assert not marker.exists()


def test_writer_exception_surfaces_and_leaves_nothing_visible(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ck = _ckpt(tmp_path, keep_last=5, max_failed_saves=1)
    ck.save({"x": torch.ones(10)}, 1)
    ck.wait()

    real = disk.write_data_file

    def failing(path: Path, data: memoryview, tick: Any) -> tuple[int, int]:
        with open(path, "wb") as fh:
            fh.write(bytes(data[: len(data) // 2]))
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(disk, "write_data_file", failing)
    ck.save({"x": torch.ones(10) * 2}, 2)  # async: returns after staging
    with pytest.raises(CheckpointError, match="step 2 failed"):
        ck.wait()
    root = tmp_path / "ck"
    assert _visible(root) == ["step-000000001"]

    # Sync mode raises from save() itself; a later save works again.
    ck.async_ = False
    with pytest.raises(CheckpointError):
        ck.save({"x": torch.ones(10) * 3}, 3)
    monkeypatch.setattr(disk, "write_data_file", real)
    ck.async_ = True
    ck.save({"x": torch.ones(10) * 4}, 4)
    ck.wait()
    state: dict[str, Any] = {"x": None}
    assert ck.load(state) == 4 and torch.equal(state["x"], torch.ones(10) * 4)


def test_error_surfaces_on_next_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ck = _ckpt(tmp_path, max_failed_saves=1)

    def failing(path: Path, data: memoryview, tick: Any) -> tuple[int, int]:
        raise RuntimeError("boom")

    monkeypatch.setattr(disk, "write_data_file", failing)
    ck.save({"x": torch.ones(2)}, 1)
    with pytest.raises(CheckpointError, match="boom"):
        ck.save({"x": torch.ones(2)}, 2)


def test_staging_is_a_snapshot(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path)
    x = torch.zeros(1 << 16)
    ck.save({"x": x}, 1)
    x.add_(1)  # the training loop moves on while the write runs
    ck.wait()
    state: dict[str, Any] = {"x": None}
    ck.load(state)
    assert torch.equal(state["x"], torch.zeros(1 << 16))


def test_maybe_save_and_save_final(tmp_path: Path) -> None:
    run = tmp_path / "run"
    beats: list[int] = []
    ck = _ckpt(tmp_path, interval_steps=5, keep_last=10, events=EventLog(run, rank=0), heartbeat=lambda: beats.append(1))
    state = {"x": torch.zeros(4)}
    saved = []
    for step in range(1, 8):
        state["x"].fill_(step)
        saved.append(ck.maybe_save(state, step))
    assert saved == [False, False, False, False, True, False, False]
    assert ck.save_final() == 7
    assert _visible(tmp_path / "ck") == ["step-000000005", "step-000000007"]
    assert ck.save_final() == 7  # nothing new: no second write
    stalls = [e for e in read_events(run) if e["kind"] == "ckpt_stall"]
    assert [e["step"] for e in stalls] == [5, 7] and all("waited" in e for e in stalls)
    assert beats


def test_same_step_saved_twice_replaces(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path)
    ck.save({"x": torch.ones(3)}, 3)
    ck.save({"x": torch.ones(3) * 5}, 3)
    ck.wait()
    state: dict[str, Any] = {"x": None}
    assert ck.load(state) == 3 and torch.equal(state["x"], torch.ones(3) * 5)
    assert _visible(tmp_path / "ck") == ["step-000000003"]


def test_nonzero_rank_of_replicated_state_writes_nothing(tmp_path: Path) -> None:
    ck0 = _ckpt(tmp_path, rank=0, world_size=2)
    ck1 = _ckpt(tmp_path, rank=1, world_size=2)
    ck1.save({"x": torch.ones(3)}, 1)
    ck1.wait()
    assert not (tmp_path / "ck").exists()
    ck0.save({"x": torch.ones(3)}, 1)
    ck0.wait()
    state: dict[str, Any] = {"x": None}
    assert ck1.load(state) == 1  # every rank loads rank 0's file


def test_module_api_and_manifest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    api.configure(dir=tmp_path / "ck", interval_steps=2, writers=2)
    try:
        state = {"x": torch.arange(10)}
        assert api.maybe_save(state, 2)
        api.wait()
        raw = json.loads((tmp_path / "ck" / "step-000000002" / fmt.MANIFEST).read_text())
        assert raw["body"]["step"] == 2 and raw["body"]["files"]["data-0.bin"]["bytes"] > 0
        assert api.load({"x": None}) == 2
    finally:
        api.set_default(Checkpointer(dir=tmp_path / "unused"))


def test_from_section(tmp_path: Path) -> None:
    from resctl.profile.schema import Checkpoint

    section = Checkpoint.model_validate({"dir": str(tmp_path / "c"), "async": False, "keep_last": 3, "writers": 2})
    ck = Checkpointer.from_section(section, rank=0)
    assert (ck.async_, ck.keep_last, ck.writers, ck.rank) == (False, 3, 2, 0)


def test_fail_next_write_drill(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path, keep_last=5, max_failed_saves=1)
    ck.save({"x": torch.ones(4)}, 1)
    ck.fail_next_write("drill: write failure at step 2")
    ck.save({"x": torch.ones(4) * 2}, 2)
    with pytest.raises(CheckpointError, match="drill"):
        ck.save({"x": torch.ones(4) * 3}, 3)  # the failure surfaces here, before step 3 is staged
    ck.wait()
    assert _visible(tmp_path / "ck") == ["step-000000001"]
    ck.save({"x": torch.ones(4) * 3}, 3)
    ck.wait()
    assert _visible(tmp_path / "ck") == ["step-000000001", "step-000000003"]


def test_request_final_save_at_next_step_boundary(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path, interval_steps=100, keep_last=5)
    state = {"x": torch.zeros(4)}
    ck.maybe_save(state, 1)
    ck.request_final_save()  # what a SIGTERM handler does: only flags
    assert not (tmp_path / "ck").exists()
    state["x"].fill_(2)
    assert ck.maybe_save(state, 2)
    assert ck.final_done.is_set()
    loaded: dict[str, Any] = {"x": None}
    assert ck.load(loaded) == 2 and torch.equal(loaded["x"], torch.full((4,), 2.0))


def _hidden(root: Path, prefix: str) -> list[str]:
    """Hidden entries left by the engine (the ownership lock file is meant to stay)."""
    return sorted(e.name for e in os.scandir(root) if e.name.startswith(prefix) and e.name != ".resctl-owner")


def test_pruned_files_are_recycled_by_the_next_write(tmp_path: Path) -> None:
    """keep_last=1: the pruned checkpoint's files are overwritten in place (same inode), cut to the
    new, smaller size, and every visible checkpoint still verifies and loads bitwise."""
    ck = _ckpt(tmp_path, keep_last=1, writers=2, async_=True, recycle=True)
    root = tmp_path / "ck"
    big = torch.arange(5 << 20, dtype=torch.float32)  # 20 MB: two data files of 10 MB
    ck.save({"x": big}, 1)
    ck.wait()
    first = {n: os.stat(root / "step-000000001" / n).st_ino for n in ("data-0.bin", "data-1.bin")}
    ck.save({"x": big * 2}, 2)
    ck.wait()  # step 1 is pruned now: hidden, kept for the next write
    assert _hidden(root, ".recycle-") and not (root / "step-000000001").exists()
    small = torch.arange(2 << 20, dtype=torch.float64) - 7  # 16 MB: two files of 8 MB, the old ones must shrink
    ck.save({"x": small}, 3)
    ck.wait()
    assert {n: os.stat(root / "step-000000003" / n).st_ino for n in first} == first
    manifest = json.loads((root / "step-000000003" / fmt.MANIFEST).read_text())["body"]
    for name, info in manifest["files"].items():
        assert (root / "step-000000003" / name).stat().st_size == info["bytes"]
    assert [s for s, _ in fmt.list_step_dirs(root)] == [3]
    state: dict[str, Any] = {"x": None}
    assert ck.load(state) == 3
    _assert_same(state["x"], small)
    ck.close()
    assert not _hidden(root, ".recycle-")  # close gives the space of a waiting directory back


def test_recycle_off_deletes_and_a_killed_writers_recycle_dir_is_cleaned(tmp_path: Path) -> None:
    ck = _ckpt(tmp_path, keep_last=1, recycle=False)
    root = tmp_path / "ck"
    for step in (1, 2, 3):
        ck.save({"x": torch.full((64,), float(step))}, step)
        ck.wait()
    assert not _hidden(root, ".recycle-") and [s for s, _ in fmt.list_step_dirs(root)] == [3]
    # A process killed while a pruned checkpoint waited for recycling leaves it hidden; the next
    # process removes it before its first save and never loads it.
    (root / ".recycle-dead").mkdir()
    (root / ".recycle-dead" / "data-0.bin").write_bytes(b"\0" * 64)
    ck2 = _ckpt(tmp_path, keep_last=1)
    state: dict[str, Any] = {"x": None}
    assert ck2.load(state) == 3
    ck2.save({"x": torch.ones(64)}, 4)
    ck2.wait()
    assert ".recycle-dead" not in _hidden(root, ".recycle-")
    ck2.close()


def test_profile_key_turns_recycling_off(tmp_path: Path) -> None:
    from resctl.profile.schema import Checkpoint as Section

    on = Checkpointer.from_section(Section(dir=str(tmp_path / "a")), rank=0, world_size=1)
    off = Checkpointer.from_section(Section(dir=str(tmp_path / "b"), recycle=False), rank=0, world_size=1)
    assert (on.settings.recycle, off.settings.recycle) == (True, False)
    on.close()
    off.close()
