"""Where each DataLoader of the job stands, saved in the checkpoint, and an exact resume mid-epoch.

A resumed run must see the batches the uninterrupted run would have seen next. This module
records, per loader and per rank, what that takes (in the same verified checkpoint as the model, disk
and memory tier alike, as an ordinary `state_dict()` entry marked `resctl_per_rank`: ranks > 0 keep
theirs beside rank 0's disk checkpoint, `resctl.checkpoint.rankside`), and fast-forwards the loader's *index*
stream on resume, so the skipped samples are never loaded, with `num_workers > 0` too: the
workers are only ever sent the remaining indices.

Recorded per loader (`Track.position`, plain values only: weights_only-safe):

- `epoch`: the sampler's `epoch` (as `set_epoch` left it) when the pass began; `consumed`: batches
  handed to the script in this pass; `length`, `done`;
- the sampler: DistributedSampler's `seed`, `shuffle`, `drop_last`, `num_replicas`, `rank` and the
  samples consumed by the whole job (`global`), RandomSampler's `num_samples`/`replacement`;
- the random state the pass began with: torch's global RNG (the DataLoader draws the workers'
  base seed from it, a RandomSampler without a generator its order), the loader's and the
  sampler's generators; and their current states (a resume at a pass boundary goes on from them);
- `batch_size`, `drop_last`, `num_workers`, `persistent_workers`, the dataset's kind and length;
- an iterable dataset's own `state_dict()` when it has one and is read in the main process.

Resume (`Track.begin`, at the first `iter(loader)` after `load`): the recorded random state is
put in place, the loader's iterator is created over a `_Resumed` index sampler whose first pass
starts at the recorded position (`list_iterator.__setstate__`: O(1) past the sampler's own list;
DistributedSampler's randperm of the dataset is paid as in every epoch of the uninterrupted run),
then torch's global RNG is put back to what the script restored. With a different world size a
DistributedSampler resumes by the job's global sample count (`resplit`); other map-style samplers
refuse (`DataPositionMismatch`: exit 2); an iterable dataset's state is not applied (approximate).

Two ways in: a loader or sampler in the checkpoint `state` (`entry_for`, used by
`resctl.checkpoint.load/save/maybe_save`), or every loader of the script (`REGISTRY.auto`, the
profile's `checkpoint.data_position = true`, installed by the shim). docs/checkpoint.md says when
the position is exact.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
)

from resctl.checkpoint.errors import CheckpointMismatch
from resctl.checkpoint.state import DATA_POSITION, is_stateful
from resctl.patching import Patches

FORMAT = 1
_OVERRIDE = "_resctl_index_sampler"  # a loader's index sampler for the pass being created
_ITERATORS: tuple[type, ...] = (type(iter([])), type(iter(range(0))))  # positionable in O(1) by __setstate__

__all__ = [
    "DATA_POSITION",
    "REGISTRY",
    "DataPositionMismatch",
    "copy_back",
    "entry_for",
    "install",
    "uninstall",
    "with_positions",
]


class DataPositionMismatch(CheckpointMismatch):
    """The recorded position cannot be continued by this loader (the message says why and what to do)."""


# --- the index arithmetic (pure; tests/unit/test_data_position.py checks it against torch) -----


def global_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """DistributedSampler's order of the whole dataset in `epoch`, before padding and subsampling."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def resplit(order: Sequence[int], consumed: int, num_replicas: int, rank: int, drop_last: bool) -> list[int]:
    """`rank`'s share of what remains of `order` after the job consumed its first `consumed` samples,
    split as DistributedSampler splits a whole epoch: padded from the order's head (or cut) to a
    multiple of `num_replicas`, then every `num_replicas`-th. With the world size that consumed them
    this is exactly the tail of the rank's own stream; with another, every remaining sample is seen
    once (plus padding)."""
    rest = list(order[consumed:]) if consumed < len(order) else []
    if drop_last:
        rest = rest[: len(rest) // num_replicas * num_replicas]
    elif rest and len(order):
        pad = -len(rest) % num_replicas
        rest += (list(order) * math.ceil(pad / len(order)))[:pad] if pad else []
    return rest[rank::num_replicas]


def batched(indices: Iterator[int], batch_size: int, drop_last: bool) -> Iterator[list[int]]:
    """BatchSampler's batching of an index stream."""
    if drop_last:
        for full in zip(*[indices] * batch_size):
            yield [*full]
        return
    batch = [*itertools.islice(indices, batch_size)]
    while batch:
        yield batch
        batch = [*itertools.islice(indices, batch_size)]


def skip_into(it: Iterator[Any], count: int) -> Iterator[Any]:
    """`it` advanced by `count` items: O(1) for list and range iterators, else by drawing them
    (indices only, never samples)."""
    if count <= 0:
        return it
    if type(it) in _ITERATORS:
        it.__setstate__(count)  # type: ignore[attr-defined]
        return it
    next(itertools.islice(it, count - 1, count), None)
    return it


def random_order(n: int, num_samples: int, generator: torch.Generator) -> list[int]:
    """RandomSampler's order without replacement, as one list (torch yields it from per-`n` permutations)."""
    out: list[int] = []
    for _ in range(num_samples // n):
        out += torch.randperm(n, generator=generator).tolist()
    out += torch.randperm(n, generator=generator).tolist()[: num_samples % n]
    return out


# --- what a loader is -----------------------------------------------------------------------


def _stock(obj: Any, cls: type) -> bool:
    return isinstance(obj, cls) and getattr(type(obj), "__iter__", None) is getattr(cls, "__iter__", None)


def describe_sampler(sampler: Any) -> dict[str, Any]:
    if isinstance(sampler, DistributedSampler):
        return {"kind": "distributed", "stock": _stock(sampler, DistributedSampler), "n": len(sampler.dataset),  # type: ignore[arg-type]
                "num_replicas": sampler.num_replicas, "rank": sampler.rank, "shuffle": sampler.shuffle,
                "seed": sampler.seed, "drop_last": sampler.drop_last}
    if isinstance(sampler, RandomSampler):
        return {"kind": "random", "stock": _stock(sampler, RandomSampler), "n": len(sampler.data_source),
                "num_samples": sampler.num_samples, "replacement": sampler.replacement}
    return {"kind": type(sampler).__name__, "stock": False}


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


def fingerprint(loader: DataLoader[Any]) -> str:
    """What must be equal for a recorded position to belong to a loader of the resumed run."""
    ds = loader.dataset
    return f"{type(ds).__name__}/{_length(ds)}/{loader.batch_size}/{type(loader.sampler).__name__}"


def _bytes(t: torch.Tensor | None) -> bytes | None:
    return None if t is None else t.numpy().tobytes()


def _tensor(b: bytes | None) -> torch.Tensor | None:
    return None if b is None else torch.frombuffer(bytearray(b), dtype=torch.uint8)


def _generators(loader: DataLoader[Any]) -> tuple[torch.Generator | None, torch.Generator | None]:
    return loader.generator, getattr(loader.sampler, "generator", None)


def _random_state(loader: DataLoader[Any]) -> dict[str, bytes | None]:
    lg, sg = _generators(loader)
    return {"rng": _bytes(torch.get_rng_state()), "loader_gen": _bytes(lg.get_state()) if lg is not None else None,
            "sampler_gen": _bytes(sg.get_state()) if sg is not None and sg is not lg else None}


def _set_generators(loader: DataLoader[Any], states: Mapping[str, bytes | None]) -> None:
    lg, sg = _generators(loader)
    if lg is not None and states.get("loader_gen") is not None:
        lg.set_state(_tensor(states["loader_gen"]))  # type: ignore[arg-type]
    if sg is not None and sg is not lg and states.get("sampler_gen") is not None:
        sg.set_state(_tensor(states["sampler_gen"]))  # type: ignore[arg-type]


def _world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


# What changes from step to step travels in tensors, so that a pass's saved structure stays equal
# and the engine checks its weights_only-safety once, not at every memory-tier snapshot.
_COUNTERS = ("consumed", "done", "per_step", "stepped")


def encode(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A position as it is saved (see `decode`)."""
    out = dict(rec)
    if not out.get("started") or "counters" in out:
        return out
    sampler = out["sampler"] = dict(out["sampler"])
    values = [int(out.pop(k, 0) or 0) for k in _COUNTERS] + [int(sampler.pop("global", 0) or 0)]
    out["counters"] = torch.tensor(values, dtype=torch.int64)
    out["now"] = {k: _tensor(v) for k, v in (out.get("now") or {}).items()}
    return out


def decode(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A saved position with its counters and random states as plain values again."""
    out = dict(rec)
    counters = out.pop("counters", None)
    if counters is None:
        return out
    *values, global_ = (int(v) for v in counters.tolist())
    out.update(zip(_COUNTERS, values))
    out["done"], out["stepped"] = bool(out["done"]), bool(out["stepped"])
    out["sampler"] = dict(out["sampler"], **{"global": global_})
    out["now"] = {k: _bytes(v) for k, v in (out.get("now") or {}).items()}
    return out


def _unsplittable(rec: Mapping[str, Any], world: int) -> bool:
    """A map-style position taken with another world size by a sampler without a job-wide order."""
    return (rec.get("world_size") != world and not rec.get("iterable")
            and (rec.get("sampler") or {}).get("kind") != "distributed")


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


class _Steps:
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
    start: dict[str, Any] | None = None  # the pass's record at its start
    iter_ref: Callable[[], Any] | None = None
    offset: int = 0  # batches of the pass skipped at its start (resume)
    stream_len: int | None = None  # batches this pass's iterator yields (None: unknown)
    base_global: int = 0  # samples the job had consumed at the start of a re-split pass
    resplit: bool = False
    steps0: int = 0
    pending: dict[str, Any] | None = None
    watching: bool = False
    per_step: int = 1  # batches per optimizer step (gradient accumulation) in the recorded pass
    stepped: bool = False  # the pass saw optimizer steps
    from_position: Callable[[int], Iterator[Any]] | None = None

    # -- saving --------------------------------------------------------------------------
    def position(self) -> dict[str, Any]:
        """This loader's position now (a waiting one, if no pass began since it was loaded)."""
        loader = self.loader_ref()
        if self.pending is not None:
            return encode(self.pending)
        if self.start is None or loader is None:
            return {"format": FORMAT, "key": self.key, "started": False}
        it = self.iter_ref() if self.iter_ref is not None else None
        yielded = getattr(it, "_num_yielded", 0) if it is not None else 0
        done = it is None or (self.stream_len is not None and yielded >= self.stream_len)
        steps = _Steps.count - self.steps0
        record = dict(self.start)
        record.update(
            consumed=self.offset + yielded, length=self.stream_len if not self.offset else _length(loader),
            done=done, now=_random_state(loader),
            per_step=max(1, round(yielded / steps)) if steps > 0 and yielded else self.per_step,
            stepped=self.stepped or steps > 0,
        )
        if record["sampler"]["kind"] == "distributed":
            record["sampler"] = sampler = dict(record["sampler"])
            per_batch = (loader.batch_size or 1) * sampler["num_replicas"]  # samples the job takes a batch
            sampler["global"] = self.base_global + yielded * per_batch if self.resplit else record["consumed"] * per_batch
            sampler["resplit"] = self.resplit
        if record["iterable"] and is_stateful(loader.dataset) and loader.num_workers == 0:
            record["dataset_state"] = loader.dataset.state_dict()  # type: ignore[attr-defined]
        return encode(record)

    def _record_start(self, loader: DataLoader[Any]) -> dict[str, Any]:
        rank, world = _world()
        return {
            "format": FORMAT, "key": self.key, "started": True, "fingerprint": fingerprint(loader),
            "epoch": getattr(loader.sampler, "epoch", None), "start": _random_state(loader),
            "sampler": describe_sampler(loader.sampler), "batch_size": loader.batch_size,
            "drop_last": loader.drop_last, "num_workers": loader.num_workers,
            "persistent_workers": loader.persistent_workers, "iterable": isinstance(loader.dataset, IterableDataset),
            "rank": rank, "world_size": world,
        }

    # -- resuming ------------------------------------------------------------------------
    def begin(self, loader: DataLoader[Any], original: Callable[[DataLoader[Any]], Any]) -> Any:
        """`iter(loader)`: a new pass, continuing a recorded position when one waits."""
        pending, self.pending = self.pending, None
        plan = None if pending is None else self._plan(pending, loader)
        if plan is None or pending is None:
            if pending is not None and pending.get("started") and pending.get("done"):
                _set_generators(loader, pending.get("now") or {})
            return self._normal(loader, original)
        return self._resumed(loader, original, pending, plan)

    def _normal(self, loader: DataLoader[Any], original: Callable[[DataLoader[Any]], Any]) -> Any:
        self.start = self._record_start(loader)
        self.offset, self.base_global, self.resplit, self.watching, self.stepped = 0, 0, False, False, False
        self.stream_len = None if isinstance(loader.dataset, IterableDataset) else _length(loader)
        it = original(loader)
        self._started(it)
        return it

    def _started(self, it: Any) -> None:
        self.iter_ref = weakref.ref(it)
        self.steps0 = _Steps.count

    def _plan(self, rec: Mapping[str, Any], loader: DataLoader[Any]) -> Plan | None:
        """How to continue `rec` with `loader` (None: a fresh pass); raises DataPositionMismatch."""
        if not rec.get("started") or rec.get("done"):
            return None
        name = f"data loader {self.key!r}"
        rank, world = _world()
        if _unsplittable(rec, world):  # first: a per-rank shard's length changes with the world size too
            raise DataPositionMismatch(
                f"{name}: the world size changed ({rec['world_size']} -> {world}) and a "
                f"{type(loader.sampler).__name__} keeps no job-wide order to re-split (only a DistributedSampler "
                f"does); resume with {rec['world_size']} ranks, or start from a new checkpoint.dir (or set "
                "checkpoint.data_position = false to start this epoch over)")
        if rec.get("fingerprint") != fingerprint(loader):
            raise DataPositionMismatch(
                f"{name}: the checkpoint's position is for {rec.get('fingerprint')}, this loader is "
                f"{fingerprint(loader)} (dataset/len/batch size/sampler); restore the same data setup, or "
                "start from a new checkpoint.dir (or set checkpoint.data_position = false)")
        if rec["iterable"]:
            return self._plan_iterable(rec, loader, name)
        epoch = getattr(loader.sampler, "epoch", None)
        if epoch != rec.get("epoch"):
            self.note("epoch", f"{name}: the script set epoch {epoch}, the checkpoint was taken in epoch "
                      f"{rec.get('epoch')} after {rec['consumed']} batches: not fast-forwarded (the script "
                      "resumes its epochs its own way)")
            return None
        s, now = rec["sampler"], describe_sampler(loader.sampler)
        if s["kind"] == "distributed":
            keys = ("n", "shuffle", "seed", "drop_last")
            if [s[k] for k in keys] != [now[k] for k in keys]:
                raise DataPositionMismatch(
                    f"{name}: the DistributedSampler changed since the checkpoint (n/shuffle/seed/drop_last were "
                    f"{[s[k] for k in keys]}, now {[now[k] for k in keys]}); restore them, or start from a new "
                    "checkpoint.dir")
            if s.get("resplit") or s["num_replicas"] != now["num_replicas"]:
                if not (now["stock"] and type(loader.batch_sampler) is BatchSampler):
                    raise DataPositionMismatch(
                        f"{name}: the world size changed ({s['num_replicas']} -> {now['num_replicas']}) and a "
                        f"custom sampler ({type(loader.sampler).__name__}) or batch sampler cannot be re-split; "
                        f"resume with {s['num_replicas']} ranks, or start from a new checkpoint.dir")
                if s["num_replicas"] != now["num_replicas"]:
                    self.note("resplit", f"{name}: world size {s['num_replicas']} -> {now['num_replicas']}: "
                              f"epoch {epoch} resumes after the job's first {s['global']} samples, re-split over "
                              f"{now['num_replicas']} ranks")
                return Plan(skip=0, resplit=True, global_=int(s["global"]))
        elif s["kind"] == "random" and rec["rank"] != rank:
            self.note("approximate", f"{name}: rank {rank} resumes from rank {rec['rank']}'s record (this rank "
                      "saved no position of its own: the script saves on rank 0 only, or the position came from "
                      "an intercepted torch.save): its RandomSampler order may differ from the uninterrupted run")
        return Plan(skip=int(rec["consumed"]))

    def _plan_iterable(self, rec: Mapping[str, Any], loader: DataLoader[Any], name: str) -> Plan | None:
        state = rec.get("dataset_state")
        rank, world = _world()
        if state is not None and (rec["rank"], rec["world_size"]) != (rank, world):
            self.note("approximate", f"{name}: position approximate: the checkpoint holds the iterable dataset "
                      f"state of rank {rec['rank']} of {rec['world_size']}, not of this rank {rank} of {world} "
                      "(another world size, or this rank saved no position of its own), so its stream restarts "
                      "from the beginning")
            return None
        if state is not None and is_stateful(loader.dataset) and loader.num_workers == 0:
            loader.dataset.load_state_dict(state)  # type: ignore[attr-defined]
            self.note("resumed", f"{name}: the iterable dataset resumed from its own state_dict() after "
                      f"{rec['consumed']} batches", quiet=True)
            return None
        why = "has no state_dict()" if not is_stateful(loader.dataset) else "is read by worker processes"
        self.note("approximate", f"{name}: position approximate: the iterable dataset "
                  f"{type(loader.dataset).__name__} {why}, so its stream restarts from the beginning, not "
                  f"after the {rec['consumed']} batches the checkpoint had consumed")
        return None

    def _resumed(self, loader: DataLoader[Any], original: Callable[[DataLoader[Any]], Any], rec: dict[str, Any], plan: Plan) -> Any:
        self.iter_ref = None  # watch() must not see the previous pass's iterator while this one is made
        real = _index_sampler_of(loader)
        resumed = _Resumed(real, lambda: self._remaining(loader, real, rec, plan), self)
        self.start = dict(self._record_start(loader), epoch=rec.get("epoch"), start=rec["start"])
        self.start.pop("stepped", None)
        self.offset, self.resplit, self.base_global = plan.skip, plan.resplit, plan.global_
        self.per_step = int(rec.get("per_step") or 1)
        length = _length(real)
        self.stream_len = None if length is None else max(0, length - plan.skip)
        saved_rng = torch.get_rng_state()
        start = rec["start"]
        if start.get("rng") is not None:
            torch.set_rng_state(_tensor(start["rng"]))  # type: ignore[arg-type]
        _set_generators(loader, start)
        loader.__dict__[_OVERRIDE] = resumed
        existing = getattr(loader, "_iterator", None)
        if existing is not None:  # persistent workers: the iterator keeps the index sampler it was made with
            existing._index_sampler = resumed
        try:
            it = original(loader)
            resumed.prime()
        finally:
            loader.__dict__.pop(_OVERRIDE, None)
            torch.set_rng_state(saved_rng)  # the script's (restored) RNG, not the pass's start
        self._started(it)
        # Only a pass that trained with torch.optim steps can tell a skipping script by its missing steps.
        self.stepped = bool(rec.get("stepped"))
        self.watching = plan.skip > 0 and self.stepped
        REGISTRY.say("resumed", self.key, f"data loader {self.key!r}: epoch {rec.get('epoch')} resumed after "
                     f"{rec['consumed']} of {rec.get('length')} batches (skipped samples not loaded)", quiet=True)
        return it

    def _remaining(self, loader: DataLoader[Any], real: Any, rec: Mapping[str, Any], plan: Plan) -> Iterator[Any]:
        """The batch indices of the resumed pass (computed while the pass's random state is in place)."""
        sampler, bs = loader.sampler, loader.batch_size
        if plan.resplit:
            s = rec["sampler"]
            order = global_order(s["n"], s["shuffle"], s["seed"], rec["epoch"])
            mine = resplit(order, plan.global_, sampler.num_replicas, sampler.rank, s["drop_last"])  # type: ignore[attr-defined]
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
        if _Steps.count > self.steps0:
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
        self.stream_len = _length(self.loader_ref())
        self.note("self-skip", f"{name}: the script skips the batches it already trained itself; resctl "
                  f"stopped fast-forwarding this pass {exact}")

    def note(self, action: str, message: str, quiet: bool = False) -> None:
        REGISTRY.say(action, self.key, message, quiet)


# --- the registry of tracked loaders and the patches ------------------------------------------


class Registry:
    """Tracked loaders (weakly), the positions loaded for the zero-edit entry, and how to talk."""

    def __init__(self) -> None:
        self.tracks: weakref.WeakKeyDictionary[DataLoader[Any], Track] = weakref.WeakKeyDictionary()
        self.samplers: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.auto = False
        self.waiting: list[dict[str, Any]] = []  # zero-edit positions not yet claimed by a loader
        self.by_key: dict[str, dict[str, Any]] = {}  # explicit positions loaded before their loader iterated
        self.said: set[tuple[str, str]] = set()
        self.events: Any = None
        self._ordinal = 0

    def reset(self) -> None:
        """A new run of the script (in-process restart): the old loaders are not its loaders."""
        self.tracks = weakref.WeakKeyDictionary()
        self.samplers = weakref.WeakKeyDictionary()
        self.waiting, self._ordinal, self.by_key = [], 0, {}
        self.said = set()

    def say(self, action: str, key: str, message: str, quiet: bool = False) -> None:
        if (action, key) in self.said:
            return
        self.said.add((action, key))
        if not quiet or (action == "resumed" and _world()[0] == 0):  # one line per job for a resume
            print(f"resctl: data position: {message}", file=sys.stderr, flush=True)
        events = self.events
        if events is not None:
            try:
                events.emit("data_position", loader=key, action=action, message=message)
            except Exception:  # noqa: BLE001 - a note must never fail a step
                pass

    def track(self, loader: DataLoader[Any], key: str | None = None) -> Track:
        track = self.tracks.get(loader)
        if track is None:
            if key is None:
                key = f"#{self._ordinal}"
                self._ordinal += 1
            track = self.tracks[loader] = Track(key, weakref.ref(loader))
            if key.startswith("#"):
                self._claim(track, loader)
            else:
                track.pending = self.by_key.pop(key, None)
        return track

    def _claim(self, track: Track, loader: DataLoader[Any]) -> None:
        """The waiting position of `loader`: the first of its fingerprint; else, with another world size,
        the first one that cannot be re-split (its loader's fingerprint changes with the world size when
        it reads a per-rank shard: the resume is refused rather than silently started over)."""
        fp, world = fingerprint(loader), _world()[1]
        match = next((i for i, rec in enumerate(self.waiting) if rec.get("fingerprint") == fp), None)
        if match is None:
            match = next((i for i, rec in enumerate(self.waiting) if _unsplittable(rec, world)), None)
        if match is not None:
            track.pending = self.waiting.pop(match)
            track.pending["key"] = track.key

    def track_for(self, loader: DataLoader[Any]) -> Track | None:
        track = self.tracks.get(loader)
        if track is not None:
            return track
        key = None
        if self.samplers:  # a sampler placed in the checkpoint state names its loader's track
            key = self.samplers.get(loader.sampler)
            if key is None and loader.batch_sampler is not None:
                key = self.samplers.get(loader.batch_sampler)
        if key is not None:
            return self.track(loader, key)
        if not self.auto:
            return None
        if is_stateful(loader):
            self.say("left", type(loader).__name__, f"{type(loader).__name__} keeps its own state_dict(): "
                     "resctl leaves its position to it (put it in the checkpoint state to save it)")
            return None
        return self.track(loader)

    # -- the zero-edit entry ---------------------------------------------------------------
    def auto_state(self, skip: set[int]) -> dict[str, Any]:
        rank, world = _world()
        loaders = [t.position() for loader, t in list(self.tracks.items())
                   if id(loader) not in skip and t.key.startswith("#")]
        return {"format": FORMAT, "rank": rank, "world_size": world,
                "loaders": loaders + [encode(rec) for rec in self.waiting]}

    def load_auto(self, saved: Mapping[str, Any]) -> None:
        if not isinstance(saved, Mapping) or saved.get("format") != FORMAT:
            raise DataPositionMismatch(f"the checkpoint's data position has format {saved.get('format')!r}; "
                                       f"this resctl reads {FORMAT}: set checkpoint.data_position = false")
        self.waiting = [decode(rec) for rec in saved.get("loaders", []) if rec.get("started")]
        for loader, track in list(self.tracks.items()):  # loaders iterated before the load
            if track.key.startswith("#"):
                track.pending = None
                self._claim(track, loader)


REGISTRY = Registry()
_PATCHES = Patches("dataposition")
_ORIGINAL_INDEX_SAMPLER: property | None = None


def install() -> Patches:
    """Patch DataLoader.__iter__ and `_index_sampler` (idempotent; `uninstall` undoes)."""
    global _ORIGINAL_INDEX_SAMPLER
    if _PATCHES:
        return _PATCHES
    _ORIGINAL_INDEX_SAMPLER = DataLoader.__dict__["_index_sampler"]
    original_iter = DataLoader.__iter__

    def __iter__(self: DataLoader[Any]) -> Any:
        track = REGISTRY.track_for(self)
        if track is None:
            return original_iter(self)
        return track.begin(self, original_iter)

    def index_sampler(self: DataLoader[Any]) -> Any:
        override = self.__dict__.get(_OVERRIDE)
        return override if override is not None else _index_sampler_of(self)

    _PATCHES.set(DataLoader, "__iter__", __iter__)
    _PATCHES.set(DataLoader, "_index_sampler", property(index_sampler))
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _PATCHES.on_undo(register_optimizer_step_post_hook(_Steps.hook).remove)
    return _PATCHES


def _index_sampler_of(loader: DataLoader[Any]) -> Any:
    """The loader's own index sampler (what DataLoader._index_sampler returns unpatched)."""
    prop = _ORIGINAL_INDEX_SAMPLER
    assert prop is not None and prop.fget is not None, "dataposition.install() first"
    return prop.fget(loader)


def uninstall() -> None:
    _PATCHES.undo()
    REGISTRY.auto = False
    REGISTRY.events = None
    intercept = sys.modules.get("resctl.checkpoint.intercept")
    if intercept is not None:
        intercept.EXTRAS.pop(DATA_POSITION, None)


def install_auto(events: Any = None, snapshots: bool = False) -> Callable[[], None]:
    """Zero-edit mode (the shim, `checkpoint.data_position = true`): every loader the script iterates is
    tracked and saved with every `resctl.checkpoint` save and, with `snapshots`, beside every intercepted
    torch.save snapshot; returns the undo."""
    install()
    REGISTRY.auto, REGISTRY.events = True, events
    if snapshots:
        from resctl.checkpoint import intercept

        intercept.EXTRAS[DATA_POSITION] = (lambda: REGISTRY.auto_state(set()), REGISTRY.load_auto)
    return uninstall


# --- checkpoint entries ----------------------------------------------------------------------


class LoaderEntry:
    """A loader (or a sampler: the loader iterating it) as a checkpoint `state` entry."""

    resctl_per_rank = True  # every rank saves its own position (`resctl.checkpoint.rankside`)

    def __init__(self, key: str, obj: Any) -> None:
        install()
        if REGISTRY.events is None:  # the notes go to the run's events too (the shim's checkpointer has them)
            import resctl.checkpoint as api

            REGISTRY.events = api.get().events
        self.key = key
        self._ref = weakref.ref(obj)
        if isinstance(obj, DataLoader):
            REGISTRY.track(obj, key)
        else:
            REGISTRY.samplers[obj] = key

    def _track(self) -> Track | None:
        obj = self._ref()
        if obj is None:
            return None
        if isinstance(obj, DataLoader):
            return REGISTRY.track(obj, self.key)
        for loader, track in list(REGISTRY.tracks.items()):
            if obj is loader.sampler or obj is loader.batch_sampler:
                return track
        return None

    def state_dict(self) -> dict[str, Any]:
        track = self._track()
        if track is None:  # a sampler no loader has iterated yet
            return encode(REGISTRY.by_key.get(self.key) or {"format": FORMAT, "key": self.key, "started": False})
        return track.position()

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        track = self._track()
        if track is None:  # the sampler's loader takes it when it first iterates (`Registry.track`)
            REGISTRY.by_key[self.key] = decode(saved)
        else:
            track.pending = decode(saved)


class AutoEntry:
    """The zero-edit entry: every loader the script iterates (except those in the state already)."""

    resctl_per_rank = True

    def __init__(self, skip: set[int]) -> None:
        self.skip = skip

    def state_dict(self) -> dict[str, Any]:
        return REGISTRY.auto_state(self.skip)

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        REGISTRY.load_auto(saved)


_PLAIN, _DATA, _OWN = 0, 1, 2
_KINDS: dict[type, int] = {}  # a state value's type -> what it is to this module (asked every maybe_save)


def _kind(value: Any) -> int:
    cls = type(value)
    kind = _KINDS.get(cls)
    if kind is None:
        if not isinstance(value, (DataLoader, Sampler)):
            kind = _PLAIN
        else:
            kind = _OWN if is_stateful(value) else _DATA
        _KINDS[cls] = kind
    return kind


_ENTRIES: dict[tuple[str, int], LoaderEntry] = {}


def entry_for(key: str, value: Any) -> LoaderEntry:
    """The entry of `value` under `key` (one per pair: `maybe_save` asks every step)."""
    entry = _ENTRIES.get((key, id(value)))
    if entry is None or entry._ref() is not value:
        entry = _ENTRIES[(key, id(value))] = LoaderEntry(key, value)
    return entry


def with_positions(state: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """`state` as the engine should see it: its loaders and samplers as position entries and, in
    zero-edit mode, every other loader of the script under `DATA_POSITION`; `state` itself when
    there is nothing to add. Asked at every `maybe_save`: the common case is one dict lookup per entry."""
    kinds = _KINDS
    for value in state.values():
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(value)
        if kind:
            return _with_entries(state)
    if not REGISTRY.auto or DATA_POSITION in state:
        return state
    full = dict(state)
    full[DATA_POSITION] = _AUTO
    return full


def _with_entries(state: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    full = dict(state)
    skip = set()
    for name, value in state.items():
        kind = _kind(value)
        if kind == _DATA:
            full[name] = entry_for(str(name), value)
            skip.add(id(value))
        elif kind == _OWN and REGISTRY.auto:  # a StatefulDataLoader saves itself; the engine calls its state_dict()
            skip.add(id(value))
            REGISTRY.say("left", type(value).__name__, f"{type(value).__name__} in the checkpoint state saves "
                         "its own position (state_dict()); resctl does not track it a second time", quiet=True)
    if REGISTRY.auto and DATA_POSITION not in state:
        full[DATA_POSITION] = AutoEntry(skip)
    return full


_AUTO = AutoEntry(set())


def copy_back(full: Mapping[str, Any], state: MutableMapping[str, Any]) -> None:
    """After a load into `with_positions(state)`: the plain values it replaced go back into `state`."""
    for name, value in full.items():
        if name != DATA_POSITION and not isinstance(value, (LoaderEntry, AutoEntry)):
            state[name] = value
