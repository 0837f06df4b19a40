"""The memory tier against another local user and against a second job with the same run id
(issue 27, items 1 and 5). The attacker really is another user (tests/attacker.py); the tree lives
in a world-writable sticky directory under /dev/shm, as /dev/shm itself is."""

from __future__ import annotations

import os
import shutil
import stat
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest

from resctl.checkpoint import memdir
from resctl.checkpoint.engine import Checkpointer
from tests.attacker import User, as_user, attacker  # noqa: F401 - the fixture
from tests.unit.test_checkpoint import _fresh, _training

SLOT_FILES = ("data-0.bin", "meta.pt", "manifest.json", ".manifest.json.tmp")


@pytest.fixture
def shm(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path("/tmp")
    root = base / f"rsc-attack-{uuid.uuid4().hex[:12]}"
    root.mkdir()
    root.chmod(0o1777)  # like /dev/shm: everyone may create, only owners may remove
    monkeypatch.setenv(memdir.SHM_ENV, str(root))
    monkeypatch.delenv(memdir.LAUNCH_ENV, raising=False)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _job(tmp_path: Path, name: str, run_id: str = "slurm-4242") -> Checkpointer:
    return Checkpointer(dir=tmp_path / name, interval_steps=100, memory_every=1, run_id=run_id, async_=False)


def _snapshot(c: Checkpointer, steps: range) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for step, state in _training(steps):
        c.maybe_save(state, step)
    c.wait()
    return state


def _plant(user: User, root: Path, targets: Path) -> Path:
    """As the attacker: the slot directory of rank 0 (mode 777) with links at every file name."""
    slot = root / "resctl-slurm-4242" / "rank-0" / "slot-0"

    def plant() -> None:
        slot.mkdir(parents=True)
        for level in (slot, slot.parent, slot.parent.parent):
            level.chmod(0o777)
        for name in SLOT_FILES:
            (slot / name).symlink_to(targets / name)

    as_user(user, plant)
    return slot


def test_a_tree_another_user_planted_is_refused_and_no_link_is_followed(attacker: User, shm: Path,  # noqa: F811
                                                                       tmp_path: Path) -> None:
    targets = tmp_path / "targets"  # what root must never write: an existing file and new names
    targets.mkdir()
    (targets / "data-0.bin").write_bytes(b"precious")
    slot = _plant(attacker, shm, targets)
    c = _job(tmp_path, "ck")
    _snapshot(c, range(1, 4))
    c.close()
    assert (targets / "data-0.bin").read_bytes() == b"precious", "a link was followed: file overwritten"
    assert sorted(p.name for p in targets.iterdir()) == ["data-0.bin"], "a link was followed: file created"
    assert sorted(p.name for p in slot.iterdir()) == sorted(SLOT_FILES), "nothing landed in the attacker's tree"
    assert c.memory_off and "another user" in c.memory_off, c.memory_off  # the tier is off, and says why


def test_with_a_launch_suffix_the_tree_is_private_and_the_planted_one_unused(
        attacker: User, shm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    targets = tmp_path / "targets"
    targets.mkdir()
    slot = _plant(attacker, shm, targets)
    monkeypatch.setenv(memdir.LAUNCH_ENV, memdir.new_launch())
    c = _job(tmp_path, "ck")
    saved = _snapshot(c, range(1, 4))
    c.close()
    assert not c.memory_off
    mine = memdir.job_dir(memdir.job_key("slurm-4242", ""))
    for path in [mine, *mine.rglob("*")]:
        info = path.lstat()
        assert info.st_uid == os.geteuid() and not stat.S_ISLNK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == (0o700 if path.is_dir() else 0o600), path
    assert sorted(p.name for p in slot.iterdir()) == sorted(SLOT_FILES) and not list(targets.iterdir())
    state = _fresh()
    assert _job(tmp_path, "ck").load(state) == 3  # and it restores (a restarted worker inherits the suffix)
    assert state["extra"] == saved["extra"]


def test_two_jobs_with_one_run_id_on_one_host_never_share_snapshots(shm: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `srun` steps of one allocation: the second used to resume the first's state (and, with
    other shapes, truncate the file the first had mapped: SIGBUS)."""
    launch_a, launch_b = memdir.new_launch(), memdir.new_launch()
    monkeypatch.setenv(memdir.LAUNCH_ENV, launch_a)
    first = _job(tmp_path, "ck-a")
    _snapshot(first, range(1, 6))
    monkeypatch.setenv(memdir.LAUNCH_ENV, launch_b)  # the second job's resctl run, same run id
    second = _job(tmp_path, "ck-b")
    assert second.load(_fresh()) == 0, "the second job must not resume the first job's state"
    _snapshot(second, range(1, 3))
    second.close()
    first.close()
    keys = sorted(p.name for p in shm.iterdir())
    assert len(keys) == 2 and all(k.startswith("resctl-slurm-4242-p") for k in keys), keys
    monkeypatch.setenv(memdir.LAUNCH_ENV, launch_a)  # the first job's workers, restarted by its launcher
    state = _fresh()
    assert _job(tmp_path, "ck-a").load(state) == 5 and state["extra"]["step"] == 5


def test_a_dead_launchs_tree_is_swept_a_live_ones_kept(shm: Path) -> None:
    live = memdir.job_dir("slurm-4242", launch=memdir.new_launch())  # this process: alive
    dead = memdir.job_dir("slurm-4242", launch="p999999999-0123abcd")
    for d in (live, dead):
        memdir.ensure_private(d / "rank-0" / "slot-0")
    assert memdir.sweep_dead_launches("slurm-4242") == 1
    assert live.exists() and not dead.exists()


def test_release_leaves_another_users_directory_alone(attacker: User, shm: Path, tmp_path: Path) -> None:  # noqa: F811
    _plant(attacker, shm, tmp_path)
    assert not memdir.release_job("slurm-4242", launch="")
    assert (shm / "resctl-slurm-4242" / "rank-0" / "slot-0").is_dir()
