"""A data loader's pass, recorded and resumed: what a loader is (its sampler, generators and
fingerprint), the position of the pass in progress (`Track.position`), and a resumed pass that starts
at a recorded position (`Track.begin`: a `_Resumed` index sampler whose first pass is the remaining
batches, and the watch for a script that skips the replayed batches itself).

It patches nothing: `resctl.checkpoint.dataposition` installs the patches and hands each `Track` its
`Seam` (where notes go, and the loader's own index sampler). The index arithmetic is
`resctl.checkpoint.dataorder`'s, the record `resctl.checkpoint.datarecord`'s.
"""

from __future__ import annotations

import itertools
import math
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
)

from resctl.checkpoint.dataorder import batched, global_order, random_order, resplit, skip_into
from resctl.checkpoint.datarecord import Position, RandomState, SamplerInfo, as_bytes, as_tensor
from resctl.checkpoint.errors import CheckpointMismatch
from resctl.checkpoint.state import is_stateful

OVERRIDE = "_resctl_index_sampler"  # a loader's index sampler for the pass being created (the patch reads it)


class DataPositionMismatch(CheckpointMismatch):
    """The recorded position cannot be continued by this loader (the message says why and what to do)."""


class Seam(Protocol):
    """What a track needs from the patch layer."""

    def say(self, action: str, key: str, message: str, quiet: bool = False) -> None: ...

    def own_index_sampler(self, loader: DataLoader[Any]) -> Any: ...


# --- what a loader is -----------------------------------------------------------------------


def _stock(obj: Any, cls: type) -> bool:
    return isinstance(obj, cls) and getattr(type(obj), "__iter__", None) is getattr(cls, "__iter__", None)


def describe_sampler(sampler: Any) -> SamplerInfo:
    if isinstance(sampler, DistributedSampler):
        return SamplerInfo("distributed", _stock(sampler, DistributedSampler), len(sampler.dataset),  # type: ignore[arg-type]
                           num_replicas=sampler.num_replicas, rank=sampler.rank, shuffle=sampler.shuffle,
                           seed=sampler.seed, drop_last=sampler.drop_last)
    if isinstance(sampler, RandomSampler):
        return SamplerInfo("random", _stock(sampler, RandomSampler), len(sampler.data_source),
                           num_samples=sampler.num_samples, replacement=sampler.replacement)
    return SamplerInfo(type(sampler).__name__, False)


def length_of(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


def fingerprint(loader: DataLoader[Any]) -> str:
    """What must be equal for a recorded position to belong to a loader of the resumed run."""
    ds = loader.dataset
    return f"{type(ds).__name__}/{length_of(ds)}/{loader.batch_size}/{type(loader.sampler).__name__}"


def _generators(loader: DataLoader[Any]) -> tuple[torch.Generator | None, torch.Generator | None]:
    return loader.generator, getattr(loader.sampler, "generator", None)


def _random_state(loader: DataLoader[Any]) -> RandomState:
    lg, sg = _generators(loader)
    return RandomState(as_bytes(torch.get_rng_state()), as_bytes(lg.get_state()) if lg is not None else None,
                       as_bytes(sg.get_state()) if sg is not None and sg is not lg else None)


def _set_generators(loader: DataLoader[Any], states: RandomState) -> None:
    lg, sg = _generators(loader)
    if lg is not None and states.loader_gen is not None:
        lg.set_state(as_tensor(states.loader_gen))  # type: ignore[arg-type]
    if sg is not None and sg is not lg and states.sampler_gen is not None:
        sg.set_state(as_tensor(states.sampler_gen))  # type: ignore[arg-type]


def world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


# --- the resumed pass --------------------------------------------------------------------------


@dataclass
class Plan:
    """How a resumed pass starts: `skip` batches of the recorded pass, or (`resplit`) the job's
    `global_` samples of a DistributedSampler epoch re-split over this world size."""

    skip: int
    resplit: bool = False
    global_: int = 0


class _Resumed:
    """A loader's index sampler whose first pass starts at a position; later passes are the real one's."""

    def __init__(self, real: Any, first: Callable[[], Iterator[Any]], track: Track) -> None:
        self.real = real
        self._first: Callable[[], Iterator[Any]] | None = first
        self._stream: _Stream | None = None
        self._track = track

    def __iter__(self) -> Iterator[Any]:
        stream = self._stream
        if stream is not None and not stream.sent and not stream.exhausted:
            return stream  # the iterator's __init__ and its first _reset both ask (num_workers > 0)
        if self._first is None:
            return iter(self.real)
        self._stream = _Stream(self._first, self._track)
        self._first = None
        return self._stream

    def __len__(self) -> int:
        return len(self.real)

    def prime(self) -> None:
        """Compute the first pass's indices now (while the recorded random state is in place)."""
        if self._stream is not None:
            self._stream.prime()


class _Stream:
    """The remaining batches of a resumed pass, computed on first use; while the script has not made
    an optimizer step it watches for a script that skips the replayed batches itself."""

    def __init__(self, make: Callable[[], Iterator[Any]], track: Track) -> None:
        self._make = make
        self._it: Iterator[Any] | None = None
        self.track = track
        self.sent = 0  # batches handed to the loader's iterator (yielded or in flight)
        self.exhausted = False

    def prime(self) -> None:
        if self._it is None:
            self._it = self._make()

    def __iter__(self) -> _Stream:
        return self

    def __next__(self) -> Any:
        self.prime()
        if self.track.watching:
            self.track.watch(self)
        try:
            item = next(self._it)  # type: ignore[arg-type]
        except StopIteration:
            self.exhausted = True
            raise
        self.sent += 1
        return item

    def restart_at(self, position: int, make: Callable[[int], Iterator[Any]]) -> None:
        self._it = make(position)


class Steps:
    """Optimizer steps of the process (a global post-step hook: one Python call per step)."""

    count = 0

    @classmethod
    def hook(cls, *_: Any) -> None:
        cls.count += 1


@dataclass
class Track:
    """One loader's position: the pass in progress and a recorded position waiting for the next pass."""

    key: str
    loader_ref: weakref.ref[DataLoader[Any]]
    seam: Seam
    start: Position | None = None  # the pass's record at its start
    iter_ref: Callable[[], Any] | None = None
    offset: int = 0  # batches of the pass skipped at its start (resume)
    stream_len: int | None = None  # batches this pass's iterator yields (None: unknown)
    base_global: int = 0  # samples the job had consumed at the start of a re-split pass
    resplit: bool = False
    steps0: int = 0
    pending: Position | None = None  # a recorded position waiting for the next pass
    watching: bool = False
    per_step: int = 1  # batches per optimizer step (gradient accumulation) in the recorded pass
    stepped: bool = False  # the pass saw optimizer steps
    from_position: Callable[[int], Iterator[Any]] | None = None

    # -- saving --------------------------------------------------------------------------
    def position(self) -> dict[str, Any]:
        """This loader's position now, saved form (a waiting one, if no pass began since it was loaded)."""
        loader = self.loader_ref()
        if self.pending is not None:
            return self.pending.saved()
        if self.start is None or loader is None:
            return Position(self.key).saved()
        it = self.iter_ref() if self.iter_ref is not None else None
        yielded = getattr(it, "_num_yielded", 0) if it is not None else 0
        done = it is None or (self.stream_len is not None and yielded >= self.stream_len)
        steps = Steps.count - self.steps0
        record = replace(
            self.start, consumed=self.offset + yielded,
            length=self.stream_len if not self.offset else length_of(loader), done=done, now=_random_state(loader),
            per_step=max(1, round(yielded / steps)) if steps > 0 and yielded else self.per_step,
            stepped=self.stepped or steps > 0,
        )
        if record.sampler.kind == "distributed":
            per_batch = (loader.batch_size or 1) * record.sampler.num_replicas  # samples the job takes a batch
            total = self.base_global + yielded * per_batch if self.resplit else record.consumed * per_batch
            record.sampler = replace(record.sampler, global_=total, resplit=self.resplit)
        if record.iterable and is_stateful(loader.dataset) and loader.num_workers == 0:
            record.dataset_state = loader.dataset.state_dict()  # type: ignore[attr-defined]
        return record.saved()

    def _record_start(self, loader: DataLoader[Any]) -> Position:
        rank, size = world()
        return Position(
            self.key, started=True, fingerprint=fingerprint(loader), epoch=getattr(loader.sampler, "epoch", None),
            start=_random_state(loader), sampler=describe_sampler(loader.sampler), batch_size=loader.batch_size,
            drop_last=loader.drop_last, num_workers=loader.num_workers,
            persistent_workers=loader.persistent_workers, iterable=isinstance(loader.dataset, IterableDataset),
            rank=rank, world_size=size,
        )

    # -- resuming ------------------------------------------------------------------------
    def begin(self, loader: DataLoader[Any], original: Callable[[DataLoader[Any]], Any]) -> Any:
        """`iter(loader)`: a new pass, continuing a recorded position when one waits."""
        pending, self.pending = self.pending, None
        plan = None if pending is None else self._plan(pending, loader)
        if plan is None or pending is None:
            if pending is not None and pending.started and pending.done:
                _set_generators(loader, pending.now)
            return self._normal(loader, original)
        return self._resumed(loader, original, pending, plan)

    def _normal(self, loader: DataLoader[Any], original: Callable[[DataLoader[Any]], Any]) -> Any:
        self.start = self._record_start(loader)
        self.offset, self.base_global, self.resplit, self.watching, self.stepped = 0, 0, False, False, False
        self.stream_len = None if isinstance(loader.dataset, IterableDataset) else length_of(loader)
        it = original(loader)
        self._started(it)
        return it

    def _started(self, it: Any) -> None:
        self.iter_ref = weakref.ref(it)
        self.steps0 = Steps.count

    def _plan(self, rec: Position, loader: DataLoader[Any]) -> Plan | None:
        """How to continue `rec` with `loader` (None: a fresh pass); raises DataPositionMismatch."""
        if not rec.started or rec.done:
            return None
        name = f"data loader {self.key!r}"
        rank, size = world()
        if rec.unsplittable(size):  # first: a per-rank shard's length changes with the world size too
            raise DataPositionMismatch(
                f"{name}: the world size changed ({rec.world_size} -> {size}) and a "
                f"{type(loader.sampler).__name__} keeps no job-wide order to re-split (only a DistributedSampler "
                f"does); resume with {rec.world_size} ranks, or start from a new checkpoint.dir (or set "
                "checkpoint.data_position = false to start this epoch over)")
        if rec.fingerprint != fingerprint(loader):
            raise DataPositionMismatch(
                f"{name}: the checkpoint's position is for {rec.fingerprint}, this loader is "
                f"{fingerprint(loader)} (dataset/len/batch size/sampler); restore the same data setup, or "
                "start from a new checkpoint.dir (or set checkpoint.data_position = false)")
        if rec.iterable:
            return self._plan_iterable(rec, loader, name)
        epoch = getattr(loader.sampler, "epoch", None)
        if epoch != rec.epoch:
            self.note("epoch", f"{name}: the script set epoch {epoch}, the checkpoint was taken in epoch "
                      f"{rec.epoch} after {rec.consumed} batches: not fast-forwarded (the script "
                      "resumes its epochs its own way)")
            return None
        s, now = rec.sampler, describe_sampler(loader.sampler)
        if s.kind == "distributed":
            if _settings(s) != _settings(now):
                raise DataPositionMismatch(
                    f"{name}: the DistributedSampler changed since the checkpoint (n/shuffle/seed/drop_last were "
                    f"{_settings(s)}, now {_settings(now)}); restore them, or start from a new "
                    "checkpoint.dir")
            if s.resplit or s.num_replicas != now.num_replicas:
                if not (now.stock and type(loader.batch_sampler) is BatchSampler):
                    raise DataPositionMismatch(
                        f"{name}: the world size changed ({s.num_replicas} -> {now.num_replicas}) and a "
                        f"custom sampler ({type(loader.sampler).__name__}) or batch sampler cannot be re-split; "
                        f"resume with {s.num_replicas} ranks, or start from a new checkpoint.dir")
                if s.num_replicas != now.num_replicas:
                    self.note("resplit", f"{name}: world size {s.num_replicas} -> {now.num_replicas}: "
                              f"epoch {epoch} resumes after the job's first {s.global_} samples, re-split over "
                              f"{now.num_replicas} ranks")
                return Plan(skip=0, resplit=True, global_=s.global_)
        elif s.kind == "random" and rec.rank != rank:
            self.note("approximate", f"{name}: rank {rank} resumes from rank {rec.rank}'s record (this rank "
                      "saved no position of its own: the script saves on rank 0 only, or the position came from "
                      "an intercepted torch.save): its RandomSampler order may differ from the uninterrupted run")
        return Plan(skip=rec.consumed)

    def _plan_iterable(self, rec: Position, loader: DataLoader[Any], name: str) -> Plan | None:
        state = rec.dataset_state
        rank, size = world()
        if state is not None and (rec.rank, rec.world_size) != (rank, size):
            self.note("approximate", f"{name}: position approximate: the checkpoint holds the iterable dataset "
                      f"state of rank {rec.rank} of {rec.world_size}, not of this rank {rank} of {size} "
                      "(another world size, or this rank saved no position of its own), so its stream restarts "
                      "from the beginning")
            return None
        if state is not None and is_stateful(loader.dataset) and loader.num_workers == 0:
            loader.dataset.load_state_dict(state)  # type: ignore[attr-defined]
            self.note("resumed", f"{name}: the iterable dataset resumed from its own state_dict() after "
                      f"{rec.consumed} batches", quiet=True)
            return None
        why = "has no state_dict()" if not is_stateful(loader.dataset) else "is read by worker processes"
        self.note("approximate", f"{name}: position approximate: the iterable dataset "
                  f"{type(loader.dataset).__name__} {why}, so its stream restarts from the beginning, not "
                  f"after the {rec.consumed} batches the checkpoint had consumed")
        return None

    def _resumed(self, loader: DataLoader[Any], original: Callable[[DataLoader[Any]], Any], rec: Position,
                 plan: Plan) -> Any:
        self.iter_ref = None  # watch() must not see the previous pass's iterator while this one is made
        real = self.seam.own_index_sampler(loader)
        resumed = _Resumed(real, lambda: self._remaining(loader, real, rec, plan), self)
        self.start = replace(self._record_start(loader), epoch=rec.epoch, start=rec.start)
        self.offset, self.resplit, self.base_global = plan.skip, plan.resplit, plan.global_
        self.per_step = rec.per_step or 1
        length = length_of(real)
        self.stream_len = None if length is None else max(0, length - plan.skip)
        saved_rng = torch.get_rng_state()
        start = rec.start
        if start.rng is not None:
            torch.set_rng_state(as_tensor(start.rng))  # type: ignore[arg-type]
        _set_generators(loader, start)
        loader.__dict__[OVERRIDE] = resumed
        existing = getattr(loader, "_iterator", None)
        if existing is not None:  # persistent workers: the iterator keeps the index sampler it was made with
            existing._index_sampler = resumed
        try:
            it = original(loader)
            resumed.prime()
        finally:
            loader.__dict__.pop(OVERRIDE, None)
            torch.set_rng_state(saved_rng)  # the script's (restored) RNG, not the pass's start
        self._started(it)
        # Only a pass that trained with torch.optim steps can tell a skipping script by its missing steps.
        self.stepped = rec.stepped
        self.watching = plan.skip > 0 and self.stepped
        self.note("resumed", f"data loader {self.key!r}: epoch {rec.epoch} resumed after {rec.consumed} of "
                  f"{rec.length} batches (skipped samples not loaded)", quiet=True)
        return it

    def _remaining(self, loader: DataLoader[Any], real: Any, rec: Position, plan: Plan) -> Iterator[Any]:
        """The batch indices of the resumed pass (computed while the pass's random state is in place)."""
        sampler, bs = loader.sampler, loader.batch_size
        if plan.resplit:
            s = rec.sampler
            assert s.n is not None and rec.epoch is not None
            order = global_order(s.n, s.shuffle, s.seed, rec.epoch)
            mine = resplit(order, plan.global_, sampler.num_replicas, sampler.rank, s.drop_last)  # type: ignore[attr-defined]
            assert bs is not None
            self.stream_len = len(mine) // bs if loader.drop_last else math.ceil(len(mine) / bs)
            return batched(iter(mine), bs, loader.drop_last)
        if not (type(real) is BatchSampler and real.sampler is sampler and bs is not None):
            return skip_into(iter(real), plan.skip)  # a custom batch sampler, or no batching: its own stream

        def from_position(position: int) -> Iterator[list[int]]:
            return batched(skip_into(self._indices(loader), position * bs), bs, real.drop_last)

        self.from_position = from_position
        return from_position(plan.skip)

    @staticmethod
    def _indices(loader: DataLoader[Any]) -> Iterator[int]:
        """The sampler's index stream of this pass, as a positionable iterator where torch allows."""
        sampler = loader.sampler
        if isinstance(sampler, RandomSampler) and _stock(sampler, RandomSampler) and not sampler.replacement:
            gen = sampler.generator
            if gen is None:  # what RandomSampler.__iter__ draws from the global RNG
                seed = int(torch.empty((), dtype=torch.int64).random_().item())
                gen = torch.Generator()
                gen.manual_seed(seed)
            return iter(random_order(len(sampler.data_source), sampler.num_samples, gen))
        return iter(sampler)

    # -- a script that skips the replayed batches itself -----------------------------------
    def watch(self, stream: _Stream) -> None:
        """Called as the loader asks for a batch index: has the script taken `per_step` batches of
        the resumed pass without an optimizer step? Then it skips batches itself (it iterates from
        the epoch's start to its resumed step): give it the pass from where it now expects it."""
        it = self.iter_ref() if self.iter_ref is not None else None
        if it is None:
            return
        if Steps.count > self.steps0:
            self.watching = False
            return
        if getattr(it, "_num_yielded", 0) < self.per_step:
            return
        self.watching = False
        name = f"data loader {self.key!r}"
        if self.from_position is None:
            self.note("self-skip", f"{name}: the script skips the replayed batches itself, and this loader's "
                      "custom batch sampler cannot be rewound: the data it trains on are shifted; turn "
                      "checkpoint.data_position off for this script, or drop its own skipping")
            return
        k, sent, from_position = self.offset, stream.sent, self.from_position
        # The script drops the first k batches it receives and trains the rest. Received so far (or in
        # flight to workers): positions k..k+sent-1. Serve positions `sent`.. next, so that the one it
        # trains first is position k, as in the uninterrupted run.
        if sent <= k:
            stream.restart_at(sent, from_position)
            exact = "so that none is skipped twice"
        else:  # the workers were sent more than k already: positions 2k..k+sent-1 are trained first
            stream.restart_at(0, lambda _: itertools.chain(itertools.islice(from_position(k), k),
                                                           from_position(k + sent)))
            exact = (f"so that none is skipped twice; {sent} batches were already in flight, so this epoch's "
                     "remaining batches are trained in another order (each once)")
        self.offset = 0  # the pass is now the uninterrupted one, from its first batch
        self.stream_len = length_of(self.loader_ref())
        self.note("self-skip", f"{name}: the script skips the batches it already trained itself; resctl "
                  f"stopped fast-forwarding this pass {exact}")

    def note(self, action: str, message: str, quiet: bool = False) -> None:
        self.seam.say(action, self.key, message, quiet)


def _settings(s: SamplerInfo) -> list[Any]:
    """A DistributedSampler's settings that must not change for its order to be recomputed."""
    return [s.n, s.shuffle, s.seed, s.drop_last]
