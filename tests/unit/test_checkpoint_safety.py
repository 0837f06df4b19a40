"""Loads that fail safe, pruning that keeps what is good, survivable failed saves, one owner per
directory (issue 11). Real files and processes; damage is done to the bytes on disk."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from resctl.checkpoint import disk
from resctl.checkpoint import format as fmt
from resctl.checkpoint.engine import Checkpointer
from resctl.checkpoint.errors import CheckpointDirInUse, CheckpointMismatch, SaveFailuresExceeded
from resctl.checkpoint.owner import check_free
from resctl.telemetry.events import EventLog, read_events
from tests.integration.jobs import fill_disk


def _ck(root: Path, run: Path | None = None, **kw: Any) -> Checkpointer:
    kw.setdefault("rank", 0)
    kw.setdefault("world_size", 1)
    kw.setdefault("async_", False)
    return Checkpointer(dir=root, events=EventLog(run, rank=0) if run else None, **kw)


def _state(step: int) -> dict[str, Any]:
    return {"w": torch.full((1 << 20,), float(step)), "b": torch.full((3, 5), step, dtype=torch.int64), "info": {"step": step}}


def _steps(root: Path) -> list[int]:
    return sorted(s for s, _ in fmt.list_step_dirs(root))


def _flip(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


def _rewrite_manifest(step_dir: Path, edit: Any) -> None:
    """Edit the manifest body and give it a matching checksum (a buggy tool, not bit rot)."""
    raw = json.loads((step_dir / fmt.MANIFEST).read_text())
    edit(raw["body"])
    canonical = json.dumps(raw["body"], sort_keys=True, separators=(",", ":")).encode()
    (step_dir / fmt.MANIFEST).write_text(json.dumps({"crc32": zlib.crc32(canonical), "body": raw["body"]}))


def test_damaged_multi_file_checkpoint_is_quarantined_and_the_previous_loads(tmp_path: Path) -> None:
    root, run = tmp_path / "ck", tmp_path / "run"
    ck = _ck(root, run, writers=4, keep_last=5)
    big = {"a": torch.arange(9 << 20, dtype=torch.float32), "info": {"step": 0}}  # 36 MiB: 4 data files
    for step in (1, 2):
        big["a"].add_(1)
        big["info"] = {"step": step}
        ck.save(big, step)
    assert len(list((root / "step-000000002").glob("data-*.bin"))) == 4
    _flip(root / "step-000000002" / "data-0.bin", 12345)
    state: dict[str, Any] = {"a": None, "info": None}
    assert _ck(root, run).load(state) == 1
    assert state["info"] == {"step": 1} and float(state["a"][0]) == 1.0
    assert _steps(root) == [1]
    moved = list((root / ".quarantine").iterdir())
    assert len(moved) == 1 and moved[0].name.startswith("step-000000002-")
    assert "checksum mismatch" in (moved[0] / "reason.txt").read_text()
    skips = [e for e in read_events(run) if e["kind"] == "ckpt_skip"]
    assert skips[-1]["step"] == 2 and skips[-1]["quarantined"] == str(moved[0])


@pytest.mark.parametrize("keep", [0, 2])
def test_quarantine_keeps_the_newest_n_and_never_the_good_checkpoint(tmp_path: Path, keep: int) -> None:
    """Steps 1-5 saved; steps 5, 4, 3 and 2 damaged one after another, each found by a load. With
    keep_quarantined = N only the N most recently quarantined stay; step 1, the last good one,
    is never touched and loads every time, bit for bit."""
    root, run = tmp_path / "ck", tmp_path / "run"
    ck = _ck(root, run, keep_last=10, keep_quarantined=keep)
    for step in range(1, 6):
        ck.save(_state(step), step)
    good = {p.name: p.read_bytes() for p in (root / "step-000000001").iterdir()}
    for bad in (5, 4, 3, 2):
        _flip(root / f"step-{bad:09d}" / "data-0.bin")
        state: dict[str, Any] = {"w": None, "b": None, "info": None}
        assert _ck(root, run, keep_quarantined=keep).load(state) == bad - 1
        kept = sorted((root / ".quarantine").iterdir())
        assert len(kept) == min(keep, 6 - bad), kept
    assert sorted(p.name.split("-")[1] for p in kept) == ["000000002", "000000003"][:keep]
    assert _steps(root) == [1] and {p.name: p.read_bytes() for p in (root / "step-000000001").iterdir()} == good
    assert float(state["w"][0]) == 1.0
    skips = [e for e in read_events(run) if e["kind"] == "ckpt_skip"]
    assert [e["step"] for e in skips] == [5, 4, 3, 2] and all(e["quarantined"] for e in skips)


def test_a_quarantine_that_is_a_link_is_never_pruned(tmp_path: Path) -> None:
    """`.quarantine` linked to the checkpoint directory itself (a hostile or careless setup): pruning
    would see the step directories; it must prune nothing."""
    root = tmp_path / "ck"
    ck = _ck(root, keep_last=10, keep_quarantined=0)
    for step in (1, 2):
        ck.save(_state(step), step)
    os.symlink(root, root / ".quarantine")
    assert ck.prune_quarantine() == 0
    assert _steps(root) == [1, 2]


@pytest.mark.parametrize("how", ["rename", "copy"])
def test_step_comes_from_the_manifest_not_the_directory_name(tmp_path: Path, how: str) -> None:
    root = tmp_path / "ck"
    ck = _ck(root, keep_last=5)
    for step in (1, 2):
        ck.save(_state(step), step)
    if how == "rename":  # step 2's data under the name step-3
        os.rename(root / "step-000000002", root / "step-000000003")
        want = 1
    else:  # step 1's data under the name step-5
        shutil.copytree(root / "step-000000001", root / "step-000000005")
        want = 2
    state: dict[str, Any] = {"w": None, "b": None, "info": None}
    assert _ck(root).load(state) == want
    assert state["info"] == {"step": want} and float(state["w"][0]) == want


def test_manifest_that_points_outside_the_files_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    ck = _ck(root, keep_last=5)
    for step in (1, 2):
        ck.save(_state(step), step)

    def grow(body: dict[str, Any]) -> None:  # a tensor claims more bytes than the stream holds
        body["tensors"][0] = [0, 1 << 30, "float32", [1 << 28]]

    _rewrite_manifest(root / "step-000000002", grow)
    state: dict[str, Any] = {"w": None, "b": None, "info": None}
    assert _ck(root).load(state) == 1


def test_a_checkpoint_that_does_not_fit_the_state_raises_and_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    _ck(root).save({"model": torch.nn.Linear(4, 3)}, 1)
    other = torch.nn.Linear(5, 3)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(CheckpointMismatch, match=r"model.weight: saved float32 \[3, 4\], state has float32 \[3, 5\]"):
        _ck(root).load({"model": other})
    for k, v in other.state_dict().items():
        assert torch.equal(v, before[k])
    assert _steps(root) == [1]  # intact: not quarantined
    with pytest.raises(CheckpointMismatch, match="names"):
        _ck(root).load({"model": torch.nn.Linear(4, 3), "extra": None})


class Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def test_plain_state_never_reads_dcp_metadata(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    ck = _ck(root, keep_last=5)
    ck.save(_state(1), 1)
    step1 = root / "step-000000001"
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    torch.save(Evil(str(marker)), buf)  # a pickle that runs code when unpickled
    (step1 / ".metadata").write_bytes(buf.getvalue())

    def to_dcp(body: dict[str, Any]) -> None:
        body["kind"] = "dcp"
        body["files"][".metadata"] = {"bytes": len(buf.getvalue()), "crc32": zlib.crc32(buf.getvalue())}

    _rewrite_manifest(step1, to_dcp)
    with pytest.raises(CheckpointMismatch, match="dcp checkpoint but the state is plain"):
        _ck(root).load({"w": None, "b": None, "info": None})
    assert not marker.exists()


def test_keep_last_counts_verified_checkpoints_only(tmp_path: Path) -> None:
    """Steps 20 and 30 damaged, 10 good: resuming from 10 and saving 11, 12 with keep_last 2
    keeps 11 and 12 (the damaged ones were quarantined, not counted)."""
    root = tmp_path / "ck"
    ck = _ck(root, keep_last=3)
    for step in (10, 20, 30):
        ck.save(_state(step), step)
    for step in (20, 30):
        _flip(root / fmt.step_dir_name(step) / "data-0.bin")
    ck2 = _ck(root, keep_last=2)
    state: dict[str, Any] = {"w": None, "b": None, "info": None}
    assert ck2.load(state) == 10
    # Damage that appears after the load (unknown to this process) must not count either.
    shutil.copytree(root / "step-000000010", root / "step-000000040")
    for step in (11, 12):
        ck2.save(_state(step), step)
    assert _steps(root) == [11, 12, 40]
    state = {"w": None, "b": None, "info": None}
    assert _ck(root).load(state) == 12 and state["info"] == {"step": 12}


def test_resumed_checkpoint_stays_until_a_newer_one_is_durable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ck"
    _ck(root, keep_last=1).save(_state(10), 10)
    ck = _ck(root, keep_last=1, max_failed_saves=5)
    assert ck.load({"w": None, "b": None, "info": None}) == 10

    def failing(path: Path, data: memoryview, tick: Any) -> tuple[int, int]:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(disk, "write_data_file", failing)
    ck.save(_state(11), 11)  # fails, reported, not raised
    assert _steps(root) == [10]
    monkeypatch.undo()
    ck.save(_state(12), 12)
    assert _steps(root) == [12]


@pytest.mark.parametrize("async_", [True, False])
def test_failed_saves_are_reported_retried_and_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, async_: bool) -> None:
    root, run = tmp_path / "ck", tmp_path / "run"
    ck = _ck(root, run, async_=async_, keep_last=5)  # default max_failed_saves = 3
    ck.save(_state(1), 1)
    ck.wait()
    real = disk.write_data_file

    def failing(path: Path, data: memoryview, tick: Any) -> tuple[int, int]:
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(disk, "write_data_file", failing)
    ck.save(_state(2), 2)
    ck.save(_state(3), 3)  # async: step 2's failure is reported here, training goes on
    ck.wait()  # step 3's failure: reported, not raised
    monkeypatch.setattr(disk, "write_data_file", real)
    ck.save(_state(4), 4)
    ck.wait()  # a success resets the count
    assert ck.failed_in_a_row == 0 and _steps(root) == [1, 4]
    monkeypatch.setattr(disk, "write_data_file", failing)
    with pytest.raises(SaveFailuresExceeded, match=r"step 7 failed while writing .*No space left.* 3 failed writes in a row"):
        for step in (5, 6, 7, 8):
            ck.save(_state(step), step)
        ck.wait()
    assert _steps(root) == [1, 4]
    fails = [e for e in read_events(run) if e["kind"] == "ckpt_fail"]
    assert [(e["step"], e["consecutive"]) for e in fails] == [(2, 1), (3, 2), (5, 1), (6, 2), (7, 3)]
    assert "No space left" in fails[0]["error"]


HOLDER = textwrap.dedent(
    """
    import sys, time
    from resctl.checkpoint import Checkpointer
    ck = Checkpointer(dir=sys.argv[1], rank=0, world_size=1, run_id="run-A")
    ck.load({})
    print("holding", flush=True)
    time.sleep(60)
    """
)


def test_a_second_live_owner_is_refused_and_a_dead_one_does_not_block(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(CheckpointDirInUse, match=rf"in use by run run-A \(pid {holder.pid} .*checkpoint.dir") as err:
            check_free(root)
        assert err.value.exit_code == 2
        with pytest.raises(CheckpointDirInUse):
            check_free(root, run_id="run-B")
        check_free(root, run_id="run-A")  # the same run: a node joining late (a hot spare) shares the directory
        with pytest.raises(CheckpointDirInUse):
            Checkpointer(dir=root, rank=0, world_size=1).load({})
    finally:
        holder.kill()
        holder.wait()
    check_free(root)  # the kernel dropped the dead holder's lock
    ck = _ck(root)
    ck.save(_state(1), 1)
    ck.close()


def test_resume_from_another_runs_checkpoint_is_reported(tmp_path: Path) -> None:
    root, run = tmp_path / "ck", tmp_path / "run"
    a = _ck(root, run_id="run-A")
    a.save(_state(5), 5)
    a.close()
    assert _ck(root, run, run_id="run-B").load({"w": None, "b": None, "info": None}) == 5
    other = [e for e in read_events(run) if e["kind"] == "ckpt_other_run"]
    assert other and other[0]["run_id"] == "run-A" and other[0]["step"] == 5
    assert _ck(root, tmp_path / "run2", run_id="run-A").load({"w": None, "b": None, "info": None}) == 5
    assert not [e for e in read_events(tmp_path / "run2") if e["kind"] == "ckpt_other_run"]


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 6 MiB tmpfs (root only; skipped where mounting is not allowed)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_mid_training_keeps_the_last_good_checkpoint(small_tmpfs: Path) -> None:
    """A real ENOSPC: failures are reported and retried, space coming back resumes saving, and
    the third failure in a row stops with the cause; the newest good checkpoint loads bitwise."""
    root, run = small_tmpfs / "ck", small_tmpfs.parent / "run"
    ck = Checkpointer(dir=root, rank=0, world_size=1, keep_last=2, recycle=False, events=EventLog(run, rank=0))
    state = {"w": torch.zeros(1 << 18)}  # 1 MiB per checkpoint
    filler = small_tmpfs / "filler"

    def train_to(step: int) -> None:
        state["w"].fill_(step)
        ck.save(state, step)

    train_to(1)
    train_to(2)
    ck.wait()
    fill_disk(filler)  # take every byte that is left
    train_to(3)  # async: fails in the background
    train_to(4)  # step 3's ENOSPC is reported here; training goes on
    ck.wait()  # step 4's failure reported (2 in a row), not raised
    filler.unlink()  # space comes back
    train_to(5)
    ck.wait()
    assert _steps(root) == [2, 5]
    fill_disk(filler)
    with pytest.raises(SaveFailuresExceeded, match="No space left on device"):
        for step in (6, 7, 8, 9):
            train_to(step)
        ck.wait()
    assert _steps(root) == [2, 5]
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]  # nothing half-written left
    loaded: dict[str, Any] = {"w": None}
    assert Checkpointer(dir=root, rank=0, world_size=1).load(loaded) == 5
    assert torch.equal(loaded["w"], torch.full((1 << 18,), 5.0))
    fails = [(e["step"], e["consecutive"]) for e in read_events(run) if e["kind"] == "ckpt_fail"]
    assert fails == [(3, 1), (4, 2), (6, 1), (7, 2), (8, 3)]


def test_resctl_run_refuses_a_checkpoint_dir_a_live_job_owns(tmp_path: Path) -> None:
    root = tmp_path / "ck"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        script = tmp_path / "train.py"
        script.write_text("raise SystemExit('must not start')\n")
        repo = Path(__file__).resolve().parents[2]
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
        done = subprocess.run(
            [sys.executable, "-m", "resctl", "run", "-p", str(repo / "examples/profiles/local-cpu.toml"),
             "--run-dir", str(tmp_path / "run"), "--set", f"checkpoint.dir={root}", str(script)],
            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
        )
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2, done.stderr
    assert f"checkpoint dir {root} is in use by run run-A (pid {holder.pid}" in done.stderr
    assert "checkpoint.dir" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").glob("events-*"))


def test_a_failed_metadata_write_leaves_no_directory_while_the_data_writers_finish(tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The metadata file fails (ENOSPC) while the data files are still being written on the writer pool: the
    temporary directory is removed only after they finish, so none of it stays (before: a data writer created
    its file while rmtree walked the directory, and `.tmp-step-...` stayed; seen on a loaded box)."""
    import errno
    import threading

    started, release = threading.Event(), threading.Event()
    real_data, real_write, real_rmtree = disk.write_data_file, fmt.write_file, shutil.rmtree
    writing: list[int] = []  # data writers running now
    at_cleanup: list[int] = []  # how many ran when the temporary directory was removed

    def slow_data(path: Path, data: memoryview, tick: Any) -> tuple[int, int]:
        writing.append(1)
        started.set()
        try:
            release.wait(10)  # still writing when the metadata fails and the cleanup begins
            return real_data(path, data, tick)
        finally:
            writing.pop()

    def rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name.startswith(".tmp-"):
            at_cleanup.append(len(writing))
        real_rmtree(path, *args, **kwargs)

    def full_meta(path: Path, parts: Any) -> tuple[int, int]:
        if path.name == fmt.META:
            started.wait(10)
            threading.Timer(0.2, release.set).start()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(path, parts)  # type: ignore[no-any-return]

    monkeypatch.setattr(disk, "write_data_file", slow_data)
    monkeypatch.setattr(fmt, "write_file", full_meta)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    root = tmp_path / "ck"
    ck = Checkpointer(dir=root, rank=0, world_size=1, async_=False, events=EventLog(tmp_path / "run", rank=0))
    ck.save({"w": torch.ones(1 << 16)}, 1)  # sync: the failure is recorded now (1 of the allowed in a row)
    assert at_cleanup == [0], at_cleanup  # removed once, after every data writer had ended
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp-")] == []
    assert [(e["step"], e["consecutive"]) for e in read_events(tmp_path / "run") if e["kind"] == "ckpt_fail"] == [(1, 1)]
