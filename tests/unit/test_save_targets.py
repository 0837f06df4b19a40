"""The frameworks' ways of writing a checkpoint, seen by the shim's snapshot tracker: Lightning's
torch.save into a BytesIO written through an fsspec transaction, an fsspec file written directly,
torch.save into an open file, safetensors' save_file; and their loads from file objects and
safetensors. Real files, real fsspec and safetensors, real events."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest
import safetensors.torch
import torch

from resctl.profile.schema import Profile
from resctl.shim import snapshots as tracker_mod
from resctl.shim.runtime import Shim
from resctl.telemetry.events import read_run


def shim(run: Path, rank: int = 0, cycle: int = 0) -> Shim:
    return Shim(Profile(), run, env={"RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": str(cycle)})


@pytest.fixture
def installed() -> Any:
    shims: list[Shim] = []
    yield shims
    for s in reversed(shims):
        s.uninstall()


def lightning_save(obj: Any, path: Path) -> None:
    """What lightning.fabric.utilities.cloud_io._atomic_save does with a local path."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    fs, urlpath = fsspec.core.url_to_fs(str(path))
    with fs.transaction, fs.open(urlpath, "wb") as f:
        f.write(buf.getvalue())


def lightning_load(path: Path) -> Any:
    fs, urlpath = fsspec.core.url_to_fs(str(path))
    with fs.open(urlpath, "rb") as f:
        return torch.load(f)


def direct_fsspec_save(obj: Any, path: Path) -> None:
    with fsspec.open(str(path), "wb") as f:
        torch.save(obj, f)


def open_file_save(obj: Any, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(obj, f)


def open_file_load(path: Path) -> Any:
    with open(path, "rb") as f:
        return torch.load(f)


def safetensors_save(obj: Any, path: Path) -> None:
    safetensors.torch.save_file(obj, str(path))


@pytest.mark.parametrize("save,load", [
    (lightning_save, lightning_load),
    (direct_fsspec_save, lightning_load),
    (open_file_save, open_file_load),
    (safetensors_save, lambda p: safetensors.torch.load_file(str(p))),
], ids=["lightning-bytesio-fsspec-transaction", "fsspec-file", "open-file", "safetensors"])
def test_each_way_of_writing_is_a_snapshot_and_its_load_a_resume(tmp_path: Path, installed: list[Shim],
                                                                 save: Any, load: Any) -> None:
    run, ckpt = tmp_path / "run", tmp_path / "ckpt" / "last.ckpt"
    ckpt.parent.mkdir()
    first = shim(run)
    tracker_mod.install(first)
    installed.append(first)
    for step in (10, 20):
        first.step = step
        save({"w": torch.full((4,), float(step))}, ckpt)
    first.step = 25
    written = [(e["step"], e["path"], e["bytes"], e["file_id"] is not None) for e in read_run(run)
               if e["kind"] == "snapshot"]
    size = os.path.getsize(ckpt)  # both versions have this size (the same tensor shapes)
    assert written == [(10, str(ckpt), size, True), (20, str(ckpt), size, True)]
    installed.pop().uninstall()

    second = shim(run, rank=1, cycle=1)
    tracker_mod.install(second)
    installed.append(second)
    assert float(load(ckpt)["w"][0]) == 20.0
    assert second.step == 20
    resumes = [(e["rank"], e["step"], e["path"]) for e in read_run(run) if e["kind"] == "resume"]
    assert resumes == [(1, 20, str(ckpt))]


def saved_in_memory_at_step_3(run: Path, installed: list[Shim]) -> io.BytesIO:
    """A shim installed at step 3 and a torch.save into a buffer: bytes that are a checkpoint only once a file
    of their size is written."""
    s = shim(run)
    tracker_mod.install(s)
    installed.append(s)
    s.step = 3
    buf = io.BytesIO()
    torch.save({"w": torch.ones(8)}, buf)
    return buf


def test_bytes_that_land_nowhere_or_in_a_file_of_another_size_are_no_snapshot(tmp_path: Path,
                                                                             installed: list[Shim]) -> None:
    run = tmp_path / "run"
    saved_in_memory_at_step_3(run, installed)  # kept in memory (a broadcast, a test): not a checkpoint
    with fsspec.open(str(tmp_path / "other.bin"), "wb") as f:
        f.write(b"x" * 10)  # some other file: not those bytes
    assert not [e for e in read_run(run) if e["kind"] == "snapshot"]
    with fsspec.open(str(tmp_path / "other.bin"), "rb") as f:  # reads are never snapshots
        f.read()
    assert not [e for e in read_run(run) if e["kind"] == "snapshot"]


def test_a_write_whose_with_block_raised_is_no_snapshot(tmp_path: Path, installed: list[Shim]) -> None:
    run = tmp_path / "run"
    buf = saved_in_memory_at_step_3(run, installed)
    fs, path = fsspec.core.url_to_fs(str(tmp_path / "last.ckpt"))
    with pytest.raises(RuntimeError), fs.open(path, "wb") as f:
        f.write(buf.getvalue())  # every byte, then the save fails (the script's own error, a full disk...)
        raise RuntimeError("the save failed")
    assert not [e for e in read_run(run) if e["kind"] == "snapshot"]
    with fs.open(path, "wb") as f:  # the next attempt succeeds: that one is
        f.write(buf.getvalue())
    assert [e["step"] for e in read_run(run) if e["kind"] == "snapshot"] == [3]


def test_uninstall_gives_fsspec_its_own_local_filesystem_back(tmp_path: Path) -> None:
    before = fsspec.get_filesystem_class("file")
    s = shim(tmp_path / "run")
    tracker_mod.install(s)
    assert fsspec.get_filesystem_class("file") is not before
    assert issubclass(fsspec.get_filesystem_class("file"), before)
    s.uninstall()
    assert fsspec.get_filesystem_class("file") is before
    assert safetensors.torch.save_file.__module__ == "safetensors.torch"


def test_the_local_filesystem_pickles_and_copies_as_under_torchrun(tmp_path: Path, installed: list[Shim]) -> None:
    """Lightning's ModelCheckpoint and loggers hold the local filesystem, and a dataset sent to a spawned
    loader worker is pickled: a copy is what its process serves for "file" (here the reporting one again, whose
    saves are still seen; fsspec's own in a process without resctl), never a pickling error."""
    import copy
    import pickle

    s = shim(tmp_path / "run")
    installed.append(s)
    tracker_mod.install(s)
    fs = fsspec.filesystem("file")
    for again in (pickle.loads(pickle.dumps(fs)), copy.deepcopy(fs)):
        assert type(again) is fsspec.get_filesystem_class("file")
    s.uninstall()
    installed.remove(s)
    assert type(pickle.loads(pickle.dumps(fs))) is fsspec.get_filesystem_class("file")  # fsspec's own now


@pytest.mark.parametrize("rank", [0, 1])
def test_with_data_position_a_framework_checkpoint_says_once_it_holds_no_position(
        tmp_path: Path, installed: list[Shim], rank: int, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from resctl.checkpoint import dataposition

    run, ckpt = tmp_path / "run", tmp_path / "last.ckpt"
    first = shim(run)
    tracker_mod.install(first)
    first.step = 10
    lightning_save({"w": torch.ones(2)}, ckpt)
    first.uninstall()
    monkeypatch.setenv("RANK", str(rank))
    second = shim(run, rank=rank, cycle=1)
    tracker_mod.install(second)
    installed.append(second)
    undo = dataposition.install_auto(second.events)
    try:
        lightning_load(ckpt)
        lightning_load(ckpt)  # Lightning reads it again (callbacks, loops): still one line
    finally:
        undo()
        dataposition.REGISTRY.reset()
    lines = [line for line in capsys.readouterr().err.splitlines() if "holds no data position" in line]
    assert len(lines) == (1 if rank == 0 else 0), lines
    notes = [e["action"] for e in read_run(run) if e["kind"] == "data_position"]
    assert notes == ["unpositioned"]


LAZY = """
import io, sys
from pathlib import Path
from resctl.profile.schema import Profile
from resctl.shim import snapshots
from resctl.shim.runtime import Shim
import torch
run, out = Path(sys.argv[1]), Path(sys.argv[2])
shim = Shim(Profile(), run, env={"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "0"})
snapshots.install(shim)
assert "fsspec" not in sys.modules and "safetensors.torch" not in sys.modules
import fsspec                                   # the script imports them after the shim's install
from safetensors.torch import save_file         # bound at import, as transformers and accelerate bind it
shim.step = 7
buf = io.BytesIO()
torch.save({"w": torch.ones(2)}, buf)
with fsspec.open(str(out / "a.ckpt"), "wb") as f:
    f.write(buf.getvalue())
save_file({"w": torch.ones(2)}, str(out / "model.safetensors"))
shim.uninstall()
"""


def test_libraries_imported_after_the_install_are_hooked_when_imported(tmp_path: Path) -> None:
    """The worker's path: the shim installs first, the script imports fsspec and safetensors later."""
    import subprocess
    import sys

    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", LAZY, str(run), str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    saved = sorted((Path(e["path"]).name, e["step"]) for e in read_run(run) if e["kind"] == "snapshot")
    assert saved == [("a.ckpt", 7), ("model.safetensors", 7)]
