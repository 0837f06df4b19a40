"""resctl.checkpoint.intercept: torch.save to matching paths becomes async and atomic."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from resctl.checkpoint import intercept
from resctl.checkpoint.engine import Checkpointer, CheckpointError


@pytest.fixture
def ckpt(tmp_path: Path) -> Iterator[Checkpointer]:
    ck = Checkpointer(dir=tmp_path / "unused", rank=0, world_size=1)
    orig_save, orig_load = torch.save, torch.load
    yield ck
    intercept.uninstall()
    ck.close()
    assert torch.save is orig_save and torch.load is orig_load


def test_roundtrip_matching_path(tmp_path: Path, ckpt: Checkpointer) -> None:
    intercept.install(str(tmp_path / "ck" / "*.pt"), ckpt.writes)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 8)).sum().backward()
    optim.step()
    obj = {"model": model.state_dict(), "optim": optim.state_dict(), "step": 12}
    target = tmp_path / "ck" / "last.pt"
    torch.save(obj, target)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1)  # after save() returns the caller may change its tensors

    loaded = torch.load(target)  # waits for the pending write, verifies the sidecar
    assert loaded["step"] == 12
    for k, v in expected.items():
        assert torch.equal(loaded["model"][k], v)
    assert intercept.sidecar(target).exists()
    assert not [p for p in target.parent.iterdir() if "resctl-tmp" in p.name]

    intercept.uninstall()
    # The file is a plain torch.save file: loadable without resctl.
    assert torch.equal(torch.load(target, weights_only=True)["model"]["bias"], expected["bias"])


def test_relative_glob_and_non_container_fallback(tmp_path: Path, ckpt: Checkpointer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    intercept.install("out/*.bin", ckpt.writes)
    model = torch.nn.Linear(2, 2)
    torch.save(model, "out/model.bin")  # a whole module: snapshot by serialising now
    ckpt.wait()
    again = torch.load("out/model.bin", weights_only=False)
    assert torch.equal(again.weight, model.weight)


def test_other_paths_untouched(tmp_path: Path, ckpt: Checkpointer) -> None:
    intercept.install(str(tmp_path / "ck" / "*.pt"), ckpt.writes)
    other = tmp_path / "other.pt"
    torch.save({"a": torch.ones(2)}, other)
    assert other.exists() and not intercept.sidecar(other).exists()
    buf = io.BytesIO()
    torch.save({"a": torch.ones(2)}, buf)
    assert torch.load(io.BytesIO(buf.getvalue()))["a"].sum() == 2
    assert ckpt.pending_path() is None


def test_corrupt_file_detected_on_load(tmp_path: Path, ckpt: Checkpointer) -> None:
    intercept.install(str(tmp_path / "*.pt"), ckpt.writes)
    target = tmp_path / "c.pt"
    torch.save({"a": torch.arange(1000)}, target)
    ckpt.wait()
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="does not match"):
        torch.load(target)


def test_writer_failure_surfaces_and_file_not_visible(
    tmp_path: Path, ckpt: Checkpointer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ckpt.writes.max_failed_saves = 1
    intercept.install(str(tmp_path / "*.pt"), ckpt.writes)
    target = tmp_path / "c.pt"

    def failing(path: Any, body: Any) -> None:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(intercept.fmt, "write_manifest", failing)
    torch.save({"a": torch.ones(2)}, target)
    with pytest.raises(CheckpointError, match="injected"):
        ckpt.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == []
