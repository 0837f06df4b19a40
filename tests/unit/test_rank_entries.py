"""Entries that differ per rank (a data position) are saved and restored per rank, on disk and in the
memory tier (resctl.checkpoint.rankside). Two Checkpointers in one process stand for two ranks: the
disk load is collective only with torch.distributed initialised, which the integration test
(tests/integration/test_data_position.py, `per-rank` case) covers with real ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from resctl.checkpoint import memdir, rankside
from resctl.checkpoint.engine import Checkpointer


class Position:
    """What a data position looks like to the engine: stateful and marked per rank."""

    resctl_per_rank = True

    def __init__(self, value: int = -1) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value, "rng": torch.tensor([self.value], dtype=torch.int64)}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        assert int(saved["rng"][0]) == saved["value"]
        self.value = saved["value"]


def ranks(tmp_path: Path, world: int = 2, run_id: str = "run-a", **kw: Any) -> list[Checkpointer]:
    return [Checkpointer(dir=tmp_path / "ck", rank=r, world_size=world, run_id=run_id, async_=False,
                         interval_steps=5, **kw) for r in range(world)]


def save_all(cks: list[Checkpointer], step: int, skip: tuple[int, ...] = ()) -> None:
    for rank, ck in enumerate(cks):
        if rank not in skip:
            ck.save({"w": torch.full((3,), float(step)), "pos": Position(100 * rank + step)}, step)
            ck.wait()


def load(ck: Checkpointer) -> tuple[int, int]:
    state: dict[str, Any] = {"w": torch.zeros(3), "pos": Position()}
    step = ck.load(state)
    return step, state["pos"].value


def test_every_rank_resumes_its_own_position_from_disk(tmp_path: Path) -> None:
    save_all(ranks(tmp_path), 5)
    save_all(ranks(tmp_path), 10)
    assert [load(ck) for ck in ranks(tmp_path)] == [(10, 10), (10, 110)]
    assert [s for s, _ in rankside.steps(tmp_path / "ck", 1)] == [10, 5]
    assert rankside.steps(tmp_path / "ck", 0) == []  # rank 0's is in the checkpoint itself


def test_a_script_saving_on_rank_0_only_resumes_every_rank_from_rank_0s_position(tmp_path: Path) -> None:
    save_all(ranks(tmp_path), 5, skip=(1,))
    assert [load(ck) for ck in ranks(tmp_path)] == [(5, 5), (5, 5)]


def test_a_rank_that_stopped_before_its_save_makes_every_rank_take_the_step_before(tmp_path: Path) -> None:
    save_all(ranks(tmp_path), 5)
    save_all(ranks(tmp_path), 10, skip=(1,))  # rank 1 died before it saved step 10
    # Each rank loads alone here; with torch.distributed the ranks take the MIN of their verdicts.
    assert load(ranks(tmp_path)[1]) == (5, 105)


def test_a_damaged_own_file_is_removed_and_its_step_skipped(tmp_path: Path) -> None:
    save_all(ranks(tmp_path), 5)
    save_all(ranks(tmp_path), 10)
    path = dict(rankside.steps(tmp_path / "ck", 1))[10]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert load(ranks(tmp_path)[1]) == (5, 105)
    assert not path.exists()
    assert (tmp_path / "ck" / "step-000000010").is_dir(), "rank 0's checkpoint must not be quarantined for it"


def test_another_world_size_resumes_from_rank_0s_position(tmp_path: Path) -> None:
    save_all(ranks(tmp_path), 5)
    three = ranks(tmp_path, world=3)
    assert [load(ck) for ck in three] == [(5, 5), (5, 5), (5, 5)]


def test_another_run_s_files_do_not_make_a_rank_0_only_checkpoint_skip(tmp_path: Path) -> None:
    save_all(ranks(tmp_path, run_id="run-a"), 5)
    save_all(ranks(tmp_path, run_id="run-b"), 10, skip=(1,))
    assert load(ranks(tmp_path, run_id="run-b")[1]) == (10, 10)


def test_files_follow_the_checkpoints_pruned_and_the_timeline_resumed(tmp_path: Path) -> None:
    cks = ranks(tmp_path, keep_last=2, recycle=False)
    for step in (5, 10, 15, 20):
        save_all(cks, step)
    assert [s for s, _ in rankside.steps(tmp_path / "ck", 1)] == [20, 15]
    (tmp_path / "ck" / "step-000000020").rename(tmp_path / "gone")  # as if rank 0 never published 20
    assert load(ranks(tmp_path)[1]) == (15, 115)
    assert [s for s, _ in rankside.steps(tmp_path / "ck", 1)] == [15]


def test_the_memory_tier_keeps_every_rank_s_own_position(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memdir.SHM_ENV, str(tmp_path / "shm"))
    monkeypatch.setenv("WORLD_SIZE", "2")  # a snapshot's manifest takes the world size from the environment
    (tmp_path / "shm").mkdir()
    cks = ranks(tmp_path, memory_every=1)
    for rank, ck in enumerate(cks):
        ck.maybe_save({"w": torch.full((3,), 7.0), "pos": Position(100 * rank + 7)}, 7)
        ck.close()
    assert not (tmp_path / "ck").exists()  # step 7 is not a disk step (interval 5): memory only
    assert [load(ck) for ck in ranks(tmp_path, memory_every=1)] == [(7, 7), (7, 107)]


def test_a_rank_whose_position_cannot_be_written_goes_through_the_failed_save_policy(tmp_path: Path) -> None:
    cks = ranks(tmp_path)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / rankside.DIR).write_text("not a directory")
    save_all(cks, 5)  # no exception: reported, and the next interval tries again
    assert cks[1].failed_in_a_row == 1 and cks[1].last_saved_step is None
    assert cks[0].failed_in_a_row == 0
