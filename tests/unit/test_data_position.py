"""The data position (resctl/checkpoint/dataposition.py): index arithmetic against torch's samplers,
resumed passes equal to the tail of uninterrupted ones without loading a skipped sample, and the ways
in (state entries, zero-edit registry, intercepted snapshots)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, RandomSampler

import resctl.checkpoint as api
from resctl.checkpoint import dataposition as dp
from resctl.checkpoint import intercept
from resctl.checkpoint.state import DATA_POSITION


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    dp.install()
    yield
    dp.uninstall()
    dp.REGISTRY.reset()
    dp._ENTRIES.clear()


class Recording(Dataset[int]):
    """Samples are their indices; every index read is recorded (main process only), and one in
    `forbidden` raises (inside workers too): the resumed pass must not load it."""

    def __init__(self, n: int, forbidden: set[int] | None = None) -> None:
        self.n = n
        self.read: list[int] = []
        self.forbidden = forbidden or set()
        self.checking = torch.ones(1, dtype=torch.uint8).share_memory_()  # seen by (persistent) workers too

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if self.checking[0] and i in self.forbidden:
            raise AssertionError(f"the resumed pass loaded skipped sample {i}")
        self.read.append(i)
        return i


def sampler_of(kind: str, ds: Dataset[int], world: int, rank: int, shuffle: bool, seed: int, drop_last: bool) -> Any:
    if kind == "distributed":
        return DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    if kind == "random-gen":
        return RandomSampler(ds, generator=torch.Generator().manual_seed(seed))
    if kind == "random":
        return RandomSampler(ds)
    return None  # SequentialSampler


def as_lists(batches: Any) -> list[list[int]]:
    return [b.tolist() if isinstance(b, torch.Tensor) else list(b) for b in batches]


# --- index arithmetic ---------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(n=hs.integers(1, 300), world=hs.integers(1, 8), data=hs.data(), shuffle=hs.booleans(),
       seed=hs.integers(0, 2**31), epoch=hs.integers(0, 50), drop_last=hs.booleans())
def test_resplit_with_the_same_world_is_the_tail_of_the_rank_stream(
    n: int, world: int, data: hs.DataObject, shuffle: bool, seed: int, epoch: int, drop_last: bool
) -> None:
    rank = data.draw(hs.integers(0, world - 1))
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,  # type: ignore[arg-type]
                                 drop_last=drop_last)
    sampler.set_epoch(epoch)
    stream = list(sampler)
    consumed = data.draw(hs.integers(0, len(stream)))  # samples this rank took; the job took world times that
    order = dp.global_order(n, shuffle, seed, epoch)
    assert dp.resplit(order, consumed * world, world, rank, drop_last) == stream[consumed:]
    assert list(dp.skip_into(iter(sampler), consumed)) == stream[consumed:]


@settings(max_examples=100, deadline=None)
@given(n=hs.integers(1, 300), old=hs.integers(1, 6), new=hs.integers(1, 6), data=hs.data(),
       drop_last=hs.booleans(), seed=hs.integers(0, 1000))
def test_resplit_over_another_world_gives_every_remaining_sample_once(
    n: int, old: int, new: int, data: hs.DataObject, drop_last: bool, seed: int
) -> None:
    order = dp.global_order(n, True, seed, 0)
    per_rank = (n // old) if drop_last else -(-n // old)
    consumed = data.draw(hs.integers(0, per_rank)) * old
    shares = [dp.resplit(order, consumed, new, r, drop_last) for r in range(new)]
    assert len({len(s) for s in shares}) == 1, "every rank must get as many samples (else DDP hangs)"
    seen = list(itertools.chain(*shares))
    rest = order[consumed:]
    if drop_last:
        assert len(seen) == len(rest) // new * new and set(seen) <= set(rest) and len(set(seen)) == len(seen)
    else:
        assert set(rest) <= set(seen) and len(seen) - len(rest) < new  # padding only


@settings(max_examples=40, deadline=None)
@given(n=hs.integers(1, 200), extra=hs.integers(-199, 400), seed=hs.integers(0, 2**31))
def test_random_order_is_random_sampler_order(n: int, extra: int, seed: int) -> None:
    num = max(1, n + extra)
    want = list(RandomSampler(range(n), num_samples=num, generator=torch.Generator().manual_seed(seed)))  # type: ignore[arg-type]
    assert dp.random_order(n, num, torch.Generator().manual_seed(seed)) == want


# --- a loader resumed in a "new process" yields the tail and reads nothing skipped ---------------


def interrupted(kind: str, n: int, bs: int, drop_last: bool, shuffle: bool, seed: int, epoch: int, k: int,
                world: int = 2, rank: int = 1) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """(uninterrupted pass, first k + resumed tail, indices the resumed loader read)."""

    def loader(ds: Dataset[int]) -> DataLoader[int]:
        s = sampler_of(kind, ds, world, rank, shuffle, seed, drop_last)
        if isinstance(s, DistributedSampler):
            s.set_epoch(epoch)
        return DataLoader(ds, batch_size=bs, sampler=s, drop_last=drop_last)

    torch.manual_seed(seed)
    full = as_lists(loader(Recording(n)))
    torch.manual_seed(seed)
    first = loader(Recording(n))
    entry = dp.entry_for("train", first)
    it = iter(first)
    head = as_lists(itertools.islice(it, k))
    position = entry.state_dict()
    del it
    torch.manual_seed(seed + 1)  # another process's RNG: the position must not depend on it
    ds = Recording(n)
    second = loader(ds)
    dp.entry_for("train", second).load_state_dict(position)
    tail = as_lists(second)
    return full, head + tail, ds.read


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=hs.sampled_from(["distributed", "random", "random-gen", "sequential"]), n=hs.integers(1, 120),
       bs=hs.integers(1, 9), drop_last=hs.booleans(), shuffle=hs.booleans(), seed=hs.integers(0, 10_000),
       epoch=hs.integers(0, 5), data=hs.data())
def test_a_resumed_pass_is_the_tail_of_the_uninterrupted_one(
    kind: str, n: int, bs: int, drop_last: bool, shuffle: bool, seed: int, epoch: int, data: hs.DataObject
) -> None:
    dp.REGISTRY.reset()
    dp._ENTRIES.clear()
    length = len(DataLoader(range(n), batch_size=bs, drop_last=drop_last,  # type: ignore[arg-type]
                            sampler=sampler_of(kind, Recording(n), 2, 1, shuffle, seed, drop_last)))
    k = data.draw(hs.integers(0, max(0, length - 1)))
    full, resumed, read = interrupted(kind, n, bs, drop_last, shuffle, seed, epoch, k)
    assert resumed == full
    assert read == [i for b in full[k:] for i in b], "the resumed loader read exactly the remaining samples"


def test_at_a_pass_boundary_the_generators_go_on_from_where_they_were() -> None:
    def loader() -> DataLoader[int]:
        return DataLoader(range(20), batch_size=3, sampler=RandomSampler(range(20), generator=torch.Generator().manual_seed(4)))  # type: ignore[arg-type]

    ref = loader()
    want = [as_lists(ref), as_lists(ref)]
    first = loader()
    entry = dp.entry_for("l", first)
    assert as_lists(first) == want[0]
    position = entry.state_dict()
    assert dp.decode(position)["done"]
    again = loader()
    dp.entry_for("l", again).load_state_dict(position)
    assert as_lists(again) == want[1]


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_fetch_only_the_remaining_indices_and_later_epochs_are_whole(persistent: bool) -> None:
    n, bs, k = 64, 4, 5

    def loader(ds: Dataset[int]) -> tuple[DataLoader[int], DistributedSampler[int]]:
        s = DistributedSampler(ds, num_replicas=2, rank=0, shuffle=True, seed=11)
        return DataLoader(ds, batch_size=bs, sampler=s, num_workers=2, persistent_workers=persistent), s

    ref, s = loader(Recording(n))
    epochs = []
    for e in (3, 4):
        s.set_epoch(e)
        epochs.append(as_lists(ref))
    first, s1 = loader(Recording(n))
    entry = dp.entry_for("l", first)
    s1.set_epoch(3)
    it = iter(first)
    head = as_lists(itertools.islice(it, k))
    position = entry.state_dict()
    seen = dp.decode(position)
    assert (seen["epoch"], seen["consumed"], seen["num_workers"]) == (3, k, 2)
    del it
    skipped = {i for b in epochs[0][:k] for i in b} - {i for b in epochs[0][k:] for i in b}
    second, s2 = loader(Recording(n, skipped))
    dp.entry_for("l", second).load_state_dict(position)
    s2.set_epoch(3)
    assert head + as_lists(second) == epochs[0]
    second.dataset.checking[0] = 0  # type: ignore[attr-defined]
    s2.set_epoch(4)
    assert as_lists(second) == epochs[1]


def test_another_world_size_resumes_by_global_sample_count() -> None:
    n, bs, k = 100, 5, 4
    samplers = [DistributedSampler(range(n), num_replicas=2, rank=r, shuffle=True, seed=5) for r in range(2)]  # type: ignore[arg-type]
    loaders = [DataLoader(range(n), batch_size=bs, sampler=s) for s in samplers]  # type: ignore[arg-type]
    heads, positions = [], []
    for r, loader in enumerate(loaders):
        entry = dp.entry_for(f"l{r}", loader)
        it = iter(loader)
        heads += as_lists(itertools.islice(it, k))
        positions.append(entry.state_dict())
        assert dp.decode(positions[-1])["sampler"]["global"] == k * bs * 2
    tails = []
    for r in range(3):
        s = DistributedSampler(range(n), num_replicas=3, rank=r, shuffle=True, seed=5)  # type: ignore[arg-type]
        loader = DataLoader(range(n), batch_size=bs, sampler=s)  # type: ignore[arg-type]
        entry = dp.entry_for(f"new{r}", loader)
        entry.load_state_dict(positions[0])  # a disk checkpoint keeps rank 0's record
        tails.append(as_lists(loader))
        assert entry.state_dict()["sampler"]["resplit"] is True
    assert len({len(t) for t in tails}) == 1
    seen = [i for b in heads for i in b] + [i for t in tails for b in t for i in b]
    assert set(seen) == set(range(n)) and len(seen) - n < 3


def test_a_sampler_without_a_job_wide_order_refuses_another_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = DataLoader(range(40), batch_size=4, shuffle=True)  # type: ignore[arg-type]
    entry = dp.entry_for("l", loader)
    it = iter(loader)
    next(it)
    position = entry.state_dict()
    monkeypatch.setenv("WORLD_SIZE", "3")
    again = DataLoader(range(40), batch_size=4, shuffle=True)  # type: ignore[arg-type]
    dp.entry_for("l", again).load_state_dict(position)
    with pytest.raises(dp.DataPositionMismatch, match=r"world size changed \(2 -> 3\).*resume with 2 ranks"):
        iter(again)
    # A CheckpointMismatch: under the shim it stops the job with exit 2 (runtime.stop_if_incurable).
    assert issubclass(dp.DataPositionMismatch, api.CheckpointMismatch)


def test_another_data_setup_is_refused_with_the_reason() -> None:
    loader = DataLoader(range(40), batch_size=4)  # type: ignore[arg-type]
    entry = dp.entry_for("l", loader)
    next(iter_keep := iter(loader))
    position = entry.state_dict()
    del iter_keep
    other = DataLoader(range(41), batch_size=4)  # type: ignore[arg-type]
    dp.entry_for("l", other).load_state_dict(position)
    with pytest.raises(dp.DataPositionMismatch, match="range/40/4.*range/41/4"):
        iter(other)


def test_another_epoch_is_not_fast_forwarded_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    s = DistributedSampler(range(40), num_replicas=1, rank=0)  # type: ignore[arg-type]
    loader = DataLoader(range(40), batch_size=4, sampler=s)  # type: ignore[arg-type]
    s.set_epoch(2)
    entry = dp.entry_for("l", loader)
    it = iter(loader)
    next(it)
    position = entry.state_dict()
    del it
    s2 = DistributedSampler(range(40), num_replicas=1, rank=0)  # type: ignore[arg-type]
    again = DataLoader(range(40), batch_size=4, sampler=s2)  # type: ignore[arg-type]
    dp.entry_for("l", again).load_state_dict(position)
    assert len(as_lists(again)) == 10  # epoch 0 (the script's choice), whole
    assert "the script set epoch 0, the checkpoint was taken in epoch 2" in capsys.readouterr().err


# --- datasets that are not map-style -------------------------------------------------------------


class Stream(IterableDataset[int]):
    def __init__(self, n: int) -> None:
        self.n, self.at = n, 0

    def __iter__(self) -> Iterator[int]:
        while self.at < self.n:
            self.at += 1
            yield self.at - 1


class StatefulStream(Stream):
    def state_dict(self) -> dict[str, int]:
        return {"at": self.at}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.at = state["at"]


def test_an_iterable_dataset_with_its_own_state_resumes_exactly() -> None:
    ds = StatefulStream(30)
    loader = DataLoader(ds, batch_size=4)
    entry = dp.entry_for("s", loader)
    it = iter(loader)
    head = as_lists(itertools.islice(it, 3))
    position = entry.state_dict()
    assert position["dataset_state"] == {"at": 12}
    again = DataLoader(StatefulStream(30), batch_size=4)
    dp.entry_for("s", again).load_state_dict(position)
    assert head + as_lists(again) == as_lists(DataLoader(StatefulStream(30), batch_size=4))


def test_an_iterable_dataset_without_state_says_the_position_is_approximate(capsys: pytest.CaptureFixture[str]) -> None:
    loader = DataLoader(Stream(30), batch_size=4)
    entry = dp.entry_for("s", loader)
    it = iter(loader)
    next(it)
    position = entry.state_dict()
    again = DataLoader(Stream(30), batch_size=4)
    dp.entry_for("s", again).load_state_dict(position)
    assert len(as_lists(again)) == 8
    err = capsys.readouterr().err
    assert "position approximate" in err and "Stream has no state_dict()" in err


def test_another_rank_s_iterable_state_is_not_applied(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RANK", "0")
    loader = DataLoader(StatefulStream(30), batch_size=4)
    entry = dp.entry_for("s", loader)
    it = iter(loader)
    next(it)
    position = entry.state_dict()
    monkeypatch.setenv("RANK", "1")  # rank 1 given rank 0's record (it saved none of its own)
    again = DataLoader(StatefulStream(30), batch_size=4)
    dp.entry_for("s", again).load_state_dict(position)
    assert len(as_lists(again)) == 8  # its own stream from the start, not rank 0's position in it
    assert "holds the iterable dataset state of rank 0 of 1, not of this rank 1 of 1" in capsys.readouterr().err


def test_zero_edit_refuses_a_per_rank_shard_under_another_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard's length changes with the world size, so no fingerprint matches: the record is still
    claimed and refused, rather than the epoch started over without a word."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    dp.install_auto()
    loader = DataLoader(list(range(0, 40, 2)), batch_size=4, shuffle=True)  # type: ignore[arg-type]
    it = iter(loader)
    next(it)
    saved = dp.REGISTRY.auto_state(set())
    dp.REGISTRY.reset()
    monkeypatch.setenv("WORLD_SIZE", "1")
    dp.REGISTRY.load_auto(saved)
    whole = DataLoader(list(range(40)), batch_size=4, shuffle=True)  # type: ignore[arg-type]
    with pytest.raises(dp.DataPositionMismatch, match=r"world size changed \(2 -> 1\) and a RandomSampler"):
        iter(whole)


# --- through the public API: explicit entries, zero-edit, a script that skips itself ------------


def train(tmp: Path, *, stop_at: int | None, skip_itself: bool, workers: int, explicit: bool,
          epochs: int = 3, batch: int = 2) -> tuple[dict[str, torch.Tensor], int]:
    """A script's loop: epoch from the resumed step, checkpoint every 5 steps; `stop_at` raises there."""
    api.configure(dir=tmp, interval_steps=5, async_=False)
    torch.manual_seed(0)
    x = torch.randn(48, 3)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=1)
    loader = DataLoader(data, batch_size=batch, sampler=sampler, num_workers=workers, persistent_workers=workers > 0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    state: dict[str, Any] = {"model": model, "opt": opt, "meta": {"note": "plain"}}
    if explicit:
        state["loader"] = loader
    start = step = api.load(state)
    spe = len(loader)
    for epoch in range(start // spe, epochs):
        sampler.set_epoch(epoch)
        for i, (xb, yb) in enumerate(loader):
            if skip_itself and epoch * spe + i < start:
                continue
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
            step += 1
            api.maybe_save(state, step)
            if step == stop_at:
                raise RuntimeError("killed")
    api.wait()
    return {k: v.clone() for k, v in model.state_dict().items()}, step


@pytest.mark.parametrize("mode,workers", [("explicit", 0), ("auto", 0), ("auto-skip-itself", 0), ("explicit", 2),
                                          ("auto-skip-itself", 2)])
def test_a_recovered_loop_equals_the_uninterrupted_one(tmp_path: Path, workers: int, mode: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    explicit, skip = mode == "explicit", mode.endswith("skip-itself")
    dp.REGISTRY.auto = mode.startswith("auto")
    want, steps = train(tmp_path / "ref", stop_at=None, skip_itself=skip, workers=workers, explicit=explicit)
    dp.REGISTRY.reset()
    with pytest.raises(RuntimeError, match="killed"):  # 24 steps an epoch: resumed at 35, 11 into epoch 1
        train(tmp_path / "run", stop_at=37, skip_itself=skip, workers=workers, explicit=explicit)
    dp.REGISTRY.reset()  # what the shim does before an in-process restart
    got, got_steps = train(tmp_path / "run", stop_at=None, skip_itself=skip, workers=workers, explicit=explicit)
    assert got_steps == steps == 72
    for k in want:
        assert torch.equal(got[k], want[k]), k
    err = capsys.readouterr().err
    assert ("skips the batches it already trained itself" in err) == skip


def test_a_script_skipping_itself_with_batches_in_flight_trains_each_once(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """3 batches into the epoch, but 5 were sent to the workers before the script's skipping showed."""
    dp.REGISTRY.auto = True
    _, steps = train(tmp_path / "ref", stop_at=None, skip_itself=True, workers=2, explicit=False, batch=4)
    dp.REGISTRY.reset()
    with pytest.raises(RuntimeError, match="killed"):
        train(tmp_path / "run", stop_at=17, skip_itself=True, workers=2, explicit=False, batch=4)
    dp.REGISTRY.reset()
    _, got = train(tmp_path / "run", stop_at=None, skip_itself=True, workers=2, explicit=False, batch=4)
    assert got == steps == 36
    assert "trained in another order (each once)" in capsys.readouterr().err


def test_without_the_position_the_loop_trains_the_epoch_start_twice(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        train(tmp_path, stop_at=37, skip_itself=False, workers=0, explicit=False)
    _, steps = train(tmp_path, stop_at=None, skip_itself=False, workers=0, explicit=False)
    assert steps == 72 + 11  # resumed at 35, epoch 1 from its start: 11 batches twice


def test_the_zero_edit_entry_is_optional_on_both_sides(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    api.configure(dir=tmp_path, interval_steps=1, async_=False)
    api.save({"model": model}, 1)  # before data_position was turned on
    dp.REGISTRY.auto = True
    assert api.load({"model": model}) == 1
    api.save({"model": model}, 2)  # with it
    dp.REGISTRY.auto = False
    state = {"model": model}
    assert api.load(state) == 2 and DATA_POSITION not in state


class OwnState(DataLoader):  # what torchdata's StatefulDataLoader looks like to resctl
    def state_dict(self) -> dict[str, int]:
        return {}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


def test_a_loader_with_its_own_state_dict_is_left_to_it(capsys: pytest.CaptureFixture[str]) -> None:
    dp.REGISTRY.auto = True
    loader = OwnState(range(8), batch_size=2)  # type: ignore[arg-type]
    assert len(as_lists(loader)) == 4
    assert loader not in dp.REGISTRY.tracks
    full = dp.with_positions({"loader": loader})
    assert full["loader"] is loader  # the engine calls its state_dict() itself
    assert "OwnState keeps its own state_dict()" in capsys.readouterr().err


def test_intercepted_snapshots_carry_the_position(tmp_path: Path) -> None:
    from resctl.checkpoint.engine import Checkpointer

    got: list[Any] = []
    intercept.EXTRAS["x"] = (lambda: {"consumed": 7}, got.append)
    ckpt = Checkpointer(dir=tmp_path / "c", async_=False)
    intercept.install(str(tmp_path / "*.pt"), ckpt.writes)
    try:
        torch.save({"step": 3}, tmp_path / "snap.pt")
        ckpt.wait()
        torch.save({"step": 4}, tmp_path / "snap.pt")
        ckpt.wait()
        extras = sorted(p.name for p in tmp_path.glob("snap.pt.resctl-extra-*.pt"))
        assert len(extras) == 1, extras  # the older version's extras went with it
        assert torch.load(tmp_path / "snap.pt", weights_only=True) == {"step": 4}
        assert got == [{"consumed": 7}]
        (tmp_path / extras[0]).write_bytes(b"torn")
        with pytest.raises(api.CheckpointError, match="does not match its manifest"):
            torch.load(tmp_path / "snap.pt", weights_only=True)
    finally:
        intercept.uninstall()
        intercept.EXTRAS.pop("x", None)
        ckpt.close()


def test_a_sampler_in_the_state_saves_its_loader_position(tmp_path: Path) -> None:
    def loop(stop: int | None, run: str = "run") -> list[list[int]]:
        api.configure(dir=tmp_path / run, interval_steps=3, async_=False)
        sampler = DistributedSampler(range(40), num_replicas=1, rank=0, seed=2)  # type: ignore[arg-type]
        loader = DataLoader(range(40), batch_size=4, sampler=sampler)  # type: ignore[arg-type]
        unbatched = DataLoader(range(6), batch_size=None)  # type: ignore[arg-type]  # no batch sampler at all
        state = {"sampler": sampler}
        step = api.load(state)
        seen = []
        assert as_lists([[i] for i in unbatched]) == [[i] for i in range(6)]
        for batch in loader:
            step += 1
            seen.append(batch.tolist())
            api.maybe_save(state, step)
            if step == stop:
                break
        return seen

    whole = loop(None, "ref")
    dp.REGISTRY.reset()
    head = loop(6)
    dp.REGISTRY.reset()
    assert head + loop(None) == whole
