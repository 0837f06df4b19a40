"""The memory tier (resctl.checkpoint.memory): real shared-memory files, real processes, kill -9.

The shared-memory root is a temp directory (`RESCTL_SHM_DIR`), so the tests never touch
/dev/shm and run in parallel; the code paths are the same (tmpfs or not, a file is a file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis.strategies import binary as st_bytes

from resctl.checkpoint import crc, memdir
from resctl.checkpoint import format as fmt
from resctl.checkpoint.engine import Checkpointer
from resctl.checkpoint.shmslot import Slot
from resctl.telemetry.events import EventLog, read_events
from tests.unit.test_checkpoint import _assert_same, _fresh, _training
from tests.zygote import zygote

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "shm"
    root.mkdir()
    monkeypatch.setenv(memdir.SHM_ENV, str(root))
    return root


def _ckpt(tmp_path: Path, **kw: Any) -> Checkpointer:
    args: dict[str, Any] = dict(dir=tmp_path / "ck", interval_steps=100, memory_every=1, run_id="run-a", async_=False)
    args.update(kw)
    return Checkpointer(**args)


def _slots(shm: Path, run: str = "run-a", rank: int = 0) -> Path:
    return memdir.rank_dir(memdir.job_key(run, ""), rank, shm)


def _train_and_snapshot(c: Checkpointer, steps: range) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for step, state in _training(steps):
        c.maybe_save(state, step)
    c.wait()
    return state


def test_a_new_process_state_restores_the_newest_snapshot_bitwise(tmp_path: Path, shm: Path) -> None:
    c = _ckpt(tmp_path)
    saved = _train_and_snapshot(c, range(1, 8))
    c.close()
    state = _fresh()
    c2 = _ckpt(tmp_path, events=EventLog(tmp_path / "ev", rank=0))
    assert c2.load(state) == 7
    _assert_same(state["model"].state_dict(), saved["model"].state_dict())
    _assert_same(state["optim"].state_dict(), saved["optim"].state_dict())
    assert state["extra"] == {"note": "x", "step": 7}
    (load,) = [e for e in read_events(tmp_path / "ev") if e["kind"] == "ckpt_load"]
    assert load["tier"] == "memory" and load["step"] == 7
    # The optimizer's state (new after a restart) now lives in step 7's shared pages (zero copy),
    # so that slot was detached: only step 6 is left until the next snapshot, which lands in the
    # other slot, and the one after in the detached slot's replacement.
    assert _tier_steps(shm) == [6]
    assert all(not p.exists() for p in _slots(shm).glob("slot-*/.manifest.json.tmp"))
    state2 = _train_and_snapshot_into(c2, state, range(8, 11))
    c2.close()
    assert sorted(_tier_steps(shm)) == [9, 10]
    fresh = _fresh()
    assert _ckpt(tmp_path).load(fresh) == 10
    _assert_same(fresh["optim"].state_dict(), state2["optim"].state_dict())


def _train_and_snapshot_into(c: Checkpointer, state: dict[str, Any], steps: range) -> dict[str, Any]:
    model, optim = state["model"], state["optim"]
    for step in steps:
        model(torch.randn(4, 16)).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
        c.maybe_save(state, step)
    c.wait()
    return state


def _tier_steps(shm: Path) -> list[int]:
    return [m.step for m in (fmt.read_manifest(p / fmt.MANIFEST) for p in _slots(shm).glob("slot-*")
                             if (p / fmt.MANIFEST).exists()) if m.step is not None]


def test_a_damaged_snapshot_is_skipped_for_the_other_slot_and_the_newer_timeline_forgotten(tmp_path: Path, shm: Path) -> None:
    c = _ckpt(tmp_path)
    _train_and_snapshot(c, range(1, 8))
    c.close()
    newest = max(_slots(shm).glob("slot-*"), key=lambda p: fmt.read_manifest(p / fmt.MANIFEST).step or 0)
    with open(newest / "data-0.bin", "r+b") as fh:
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0x10]))
    c2 = _ckpt(tmp_path, events=EventLog(tmp_path / "ev", rank=0))
    assert c2.load(_fresh()) == 6
    skips = [e for e in read_events(tmp_path / "ev") if e["kind"] == "ckpt_skip"]
    assert skips and skips[0]["step"] == 7 and "checksum mismatch" in skips[0]["reason"]
    # Step 7 is never offered again (an abandoned timeline); step 6's slot went to the live state.
    assert _tier_steps(shm) == []
    state = _train_and_snapshot(c2, range(7, 9))
    c2.close()
    assert sorted(_tier_steps(shm)) == [7, 8]
    fresh = _fresh()
    assert _ckpt(tmp_path).load(fresh) == 8
    _assert_same(fresh["model"].state_dict(), state["model"].state_dict())


def test_memory_older_than_disk_loses_to_disk_and_disk_is_written_from_the_snapshot(tmp_path: Path, shm: Path) -> None:
    c = _ckpt(tmp_path, interval_steps=4, memory_every=4)
    staged: list[int] = []
    stage = c.staging.stage

    def counting(tensors: list[torch.Tensor], total: int, into: torch.Tensor | None = None, specs=None) -> torch.Tensor:
        staged.append(total)
        return stage(tensors, total, into, specs)

    c.staging.stage = counting  # type: ignore[method-assign]
    saved = _train_and_snapshot(c, range(1, 9))
    assert len(staged) == 2  # steps 4 and 8: one copy out of the state each, for both tiers
    c.close()
    fresh = _fresh()
    assert _ckpt(tmp_path, memory_every=0).load(fresh) == 8  # the disk copy alone is complete
    _assert_same(fresh["optim"].state_dict(), saved["optim"].state_dict())
    for slot in _slots(shm).glob("slot-*"):  # drop the memory tier: the disk is newer now
        slot.joinpath(fmt.MANIFEST).unlink()
    c2 = _ckpt(tmp_path, events=EventLog(tmp_path / "ev", rank=0))
    assert c2.load(_fresh()) == 8
    assert [e["tier"] for e in read_events(tmp_path / "ev") if e["kind"] == "ckpt_load"] == ["disk"]


def test_another_model_or_world_size_never_loads_from_memory(tmp_path: Path, shm: Path) -> None:
    c = _ckpt(tmp_path)
    _train_and_snapshot(c, range(1, 3))
    c.close()
    other = {"model": torch.nn.Linear(3, 3), "optim": None, "extra": None}
    assert _ckpt(tmp_path, events=EventLog(tmp_path / "ev", rank=0)).load(other) == 0
    assert any("does not fit" in e["reason"] for e in read_events(tmp_path / "ev") if e["kind"] == "ckpt_skip")
    assert _ckpt(tmp_path, world_size=2).load(_fresh()) == 0


def test_a_state_that_grows_keeps_the_older_snapshot_whole_until_its_slot_is_reused(tmp_path: Path, shm: Path) -> None:
    """The optimizer's state appears after the first step, so the second snapshot is larger: mapping the
    slots for the new size must not cut the older snapshot while it is the step every rank may still need
    (a peer that has not committed the newer one rolls back to it: issue 27's two-slot invariant)."""
    c = _ckpt(tmp_path)
    small = {"w": torch.full((1000,), 1.0)}
    c.maybe_save(small, 1)
    c.wait()
    grown = {"w": torch.full((1000,), 2.0), "m": torch.full((3000,), 2.0)}
    c.maybe_save(grown, 2)
    c.wait()
    c.close()
    newest = next(p for p in _slots(shm).glob("slot-*") if fmt.read_manifest(p / fmt.MANIFEST).step == 2)
    os.unlink(newest / fmt.MANIFEST)  # step 2 lost on this rank: step 1 is what is left in memory
    back = {"w": torch.zeros(1000)}
    assert _ckpt(tmp_path).load(back) == 1 and torch.all(back["w"] == 1.0)


def test_what_was_derived_from_a_slots_mapping_goes_with_the_mapping(tmp_path: Path) -> None:
    """A slot's memo (the sharded save's DTensor wrappers of its views) is kept while the slot stays
    mapped as it is, and dropped when it is remapped for another size or detached: nothing built over
    an old mapping is ever used over the new one, or keeps the old one mapped."""
    slot = Slot(tmp_path / "slot-0")
    view = slot.buffer(64)
    slot.memo["views"] = view[:8]
    assert slot.buffer(64) is view and "views" in slot.memo  # the same mapping: kept
    slot.buffer(128)
    assert slot.memo == {}
    slot.memo["views"] = slot.buffer(128)[:8]
    slot.detach()
    assert slot.memo == {}


def test_release_removes_the_rank_and_the_empty_job_directory(tmp_path: Path, shm: Path) -> None:
    c = _ckpt(tmp_path)
    _train_and_snapshot(c, range(1, 3))
    assert _slots(shm).exists()
    c.release_memory()
    c.close()
    assert list(shm.iterdir()) == []
    _train_and_snapshot(c2 := _ckpt(tmp_path), range(1, 2))
    c2.close()
    assert memdir.release_job("run-a", shm) and list(shm.iterdir()) == []


CHILD = textwrap.dedent("""
    import sys, torch
    from resctl.checkpoint.engine import Checkpointer
    c = Checkpointer(dir=sys.argv[1], interval_steps=10**9, memory_every=1, run_id="run-a", async_=False)
    # Every element of every tensor holds the step: a torn snapshot mixes two steps.
    state = {"a": torch.zeros(3 << 20), "b": torch.zeros(1 << 20, dtype=torch.float64)}
    step = c.load(state)
    print("ready", step, flush=True)
    while True:
        step += 1
        state["a"].fill_(step)
        state["b"].fill_(step)
        c.maybe_save(state, step)
        print("saved", step, flush=True)
""")


def test_kill_9_during_12_memory_snapshots_never_restores_a_torn_one(tmp_path: Path, shm: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(REPO), memdir.SHM_ENV: str(shm), "OMP_NUM_THREADS": "1"}
    resumed: list[int] = []
    incomplete = 0
    for i in range(12):
        proc = zygote().popen([sys.executable, str(script), str(tmp_path / "ck")], env=env,
                              stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", line
        resumed.append(int(line[1]))
        # Kill when the child is in the snapshot it means to tear, not after a clock (a loaded box may not have
        # made one yet): a step's maybe_save returns once the previous snapshot is committed, and the next
        # one begins at once. At least two steps past the resumed one: one complete snapshot of this process.
        target = resumed[-1] + 2 + i % 3  # kills land at different steps of the copy/commit cycle
        while (said := proc.stdout.readline().split()) and int(said[1]) < target:
            pass
        assert said, "the child ended before its snapshots"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        incomplete += sum(not (p / fmt.MANIFEST).exists() for p in _slots(shm).glob("slot-*"))
        state = {"a": torch.zeros(3 << 20), "b": torch.zeros(1 << 20, dtype=torch.float64)}
        reader = _ckpt(tmp_path)
        step = reader.load(state)
        reader.close()  # lets the next child own the checkpoint directory
        assert step > 0
        assert torch.all(state["a"] == step) and torch.all(state["b"] == step), f"torn snapshot at step {step}"
    # Each new process resumed where the killed one's newest complete snapshot was.
    assert resumed[0] == 0 and all(b >= a for a, b in zip(resumed, resumed[1:])) and resumed[-1] > 0
    assert incomplete >= 1, "no kill landed inside a snapshot: the drill proved nothing"


CHILD_FULL = textwrap.dedent("""
    import resource, signal, sys, torch
    from resctl.checkpoint.engine import Checkpointer
    from resctl.telemetry.events import EventLog
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))  # no file over 1 MiB: a full /dev/shm
    c = Checkpointer(dir=sys.argv[1], interval_steps=10**9, memory_every=1, run_id="run-a", async_=False,
                     events=EventLog(sys.argv[2], rank=0))
    state = {"w": torch.ones(1 << 20)}
    for step in range(1, 4):
        c.maybe_save(state, step)
    print("off:", c.memory_off, flush=True)
""")


def test_a_full_shared_memory_turns_the_tier_off_without_stopping_training(tmp_path: Path, shm: Path) -> None:
    script = tmp_path / "full.py"
    script.write_text(CHILD_FULL)
    env = {**os.environ, "PYTHONPATH": str(REPO), memdir.SHM_ENV: str(shm)}
    out = zygote().run([sys.executable, str(script), str(tmp_path / "ck"), str(tmp_path / "ev")], env=env,
                       text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "off: OSError" in out.stdout
    offs = [e for e in read_events(tmp_path / "ev") if e["kind"] == "ckpt_mem_off"]
    assert len(offs) == 1 and "File too large" in offs[0]["error"]
    assert _tier_steps(shm) == []


@settings(max_examples=60, deadline=None)
@given(a=st_bytes(max_size=300), b=st_bytes(max_size=300))
def test_combined_checksums_equal_one_checksum_of_the_whole(a: bytes, b: bytes) -> None:
    assert crc.combine(crc.checksum(a), crc.checksum(b), len(b)) == crc.checksum(a + b)


def test_parallel_checksum_of_many_parts_equals_the_sequential_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setattr(crc, "CHUNK", 4096)
    data = bytes(range(256)) * 77 + b"tail"  # 4.8 parts of 4 KiB
    with ThreadPoolExecutor(3) as pool:
        assert crc.checksum_of(memoryview(data), pool) == crc.checksum(data)


def _held_commits(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Commits that wait for the returned event before they run."""
    import threading

    from resctl.checkpoint.memory import MemoryTier

    release = threading.Event()
    commit = MemoryTier._commit_slot

    def held_commit(self: MemoryTier, snap: Any, *args: Any) -> None:
        release.wait(30)
        commit(self, snap, *args)

    monkeypatch.setattr(MemoryTier, "_commit_slot", held_commit)
    return release


def _forward_waits(model: torch.nn.Module, x: torch.Tensor, release: Any) -> bool:
    """Run a forward in a thread; whether it waited until `release` was set."""
    import threading

    done = threading.Event()
    forward = threading.Thread(target=lambda: (model(x), done.set()))
    forward.start()
    waited = not done.wait(0.3)
    release.set()
    assert done.wait(30), "the forward still waits after the commit"
    forward.join()
    return waited


@pytest.mark.parametrize("every", [1, 3])
def test_the_step_ending_in_the_next_snapshot_waits_for_a_commit_still_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int) -> None:
    """Issue 31 (back-pressure): a commit still in flight when the step that ends in the next
    snapshot starts holds that step's forward, so no rank finishes it (and overwrites the older
    slot) before every rank holds the snapshot: rollback <= memory_every + the steps a commit
    spans (tests/integration/test_memory_rollback.py kills real ranks mid-commit). The steps in
    between run free while the commit goes on."""
    release = _held_commits(monkeypatch)
    c = _ckpt(tmp_path, memory_every=every)
    model = torch.nn.Linear(4, 4)
    state = {"model": model}
    x = torch.ones(1, 4)
    c.maybe_save(state, every)  # a snapshot: its commit is held back
    for step in range(every + 1, 2 * every):  # not the step before the next snapshot: no hold
        model(x)
        c.maybe_save(state, step)
    assert _forward_waits(model, x, release), "the step ending in the next snapshot ran before the commit"
    c.maybe_save(state, 2 * every)
    c.close()


def test_no_hold_without_back_pressure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that lands before the step ending in the next snapshot starts places no hold at
    all (no forward hook, no wait): the snapshot costs its copy only, and its `ckpt_mem` says so."""
    from resctl.checkpoint.memory import MemoryTier

    placed: list[bool] = []
    hold = MemoryTier.hold_if_committing
    monkeypatch.setattr(MemoryTier, "hold_if_committing", lambda self: placed.append(hold(self)) or placed[-1])
    log = EventLog(tmp_path / "run", rank=0)
    c = _ckpt(tmp_path, memory_every=2, events=log)
    model = torch.nn.Linear(4, 4)
    x = torch.ones(1, 4)
    for step in range(1, 9):
        model(x)
        c.maybe_save({"model": model}, step)
        if step % 2 == 0:
            c.memory_tier().wait()  # type: ignore[union-attr]  - the commit lands within the step
    c.close()
    assert placed == [False] * 3  # before steps 4, 6, 8 (step 2: no snapshot yet)
    mem = [e for e in read_events(tmp_path / "run") if e["kind"] == "ckpt_mem"]
    assert [e["step"] for e in mem] == [2, 4, 6, 8] and all(e["waited"] < 0.25 for e in mem), mem


def test_a_hold_is_counted_in_the_next_snapshots_cost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seconds a forward was held for a commit are that snapshot cycle's cost: the next
    `ckpt_mem` counts them in `waited` and `seconds` (the report and tune-interval read both)."""
    release = _held_commits(monkeypatch)
    log = EventLog(tmp_path / "run", rank=0)
    c = _ckpt(tmp_path, memory_every=2, events=log)
    model = torch.nn.Linear(4, 4)
    x = torch.ones(1, 4)
    c.maybe_save({"model": model}, 2)
    c.maybe_save({"model": model}, 3)  # the step before the next snapshot: the commit is in flight
    assert _forward_waits(model, x, release)
    c.maybe_save({"model": model}, 4)
    c.close()
    mem = {e["step"]: e for e in read_events(tmp_path / "run") if e["kind"] == "ckpt_mem"}
    assert mem[4]["waited"] >= 0.25 and mem[4]["seconds"] >= mem[4]["waited"], mem
