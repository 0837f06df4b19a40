"""A data loader's recorded position, typed (`Position`), and its saved form (`encode`/`decode`).

The saved form is a plain dict (weights_only-safe, one checkpoint entry per loader); what changes
from step to step travels in one int64 tensor (`counters`) and the random states in uint8 tensors,
so that a pass's saved structure stays equal and the engine checks its weights_only-safety once, not
at every memory-tier snapshot. `Position.plain()` / `Position.from_plain()` are the record as plain
values (what `decode` returns); `Position.saved()` / `Position.from_saved()` the saved form.
No torch.utils.data, no patches: `resctl.checkpoint.datapass` fills these from a loader.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

FORMAT = 1
_COUNTERS = ("consumed", "done", "per_step", "stepped")


def as_bytes(t: torch.Tensor | None) -> bytes | None:
    return None if t is None else t.numpy().tobytes()


def as_tensor(b: bytes | None) -> torch.Tensor | None:
    return None if b is None else torch.frombuffer(bytearray(b), dtype=torch.uint8)


@dataclass(frozen=True)
class RandomState:
    """torch's global RNG and a loader's and its sampler's generators (None: none, or the same one)."""

    rng: bytes | None = None
    loader_gen: bytes | None = None
    sampler_gen: bytes | None = None

    def plain(self) -> dict[str, bytes | None]:
        return {"rng": self.rng, "loader_gen": self.loader_gen, "sampler_gen": self.sampler_gen}

    @classmethod
    def from_plain(cls, d: Mapping[str, Any] | None) -> RandomState:
        d = d or {}
        return cls(d.get("rng"), d.get("loader_gen"), d.get("sampler_gen"))


@dataclass(frozen=True)
class SamplerInfo:
    """What a loader's sampler is: a DistributedSampler's or RandomSampler's settings, else its kind."""

    kind: str  # "distributed", "random", or the sampler's class name
    stock: bool = False  # torch's own __iter__ (its order can be recomputed)
    n: int | None = None  # samples in the dataset
    num_replicas: int = 1  # distributed
    rank: int = 0
    shuffle: bool = False
    seed: int = 0
    drop_last: bool = False
    num_samples: int = 0  # random
    replacement: bool = False
    global_: int = 0  # distributed: samples the whole job consumed in the pass
    resplit: bool = False  # distributed: the pass is a re-split of another world size's

    def plain(self) -> dict[str, Any]:
        if self.kind == "distributed":
            return {"kind": self.kind, "stock": self.stock, "n": self.n, "num_replicas": self.num_replicas,
                    "rank": self.rank, "shuffle": self.shuffle, "seed": self.seed, "drop_last": self.drop_last,
                    "resplit": self.resplit, "global": self.global_}
        if self.kind == "random":
            return {"kind": self.kind, "stock": self.stock, "n": self.n, "num_samples": self.num_samples,
                    "replacement": self.replacement}
        return {"kind": self.kind, "stock": self.stock}

    @classmethod
    def from_plain(cls, d: Mapping[str, Any] | None) -> SamplerInfo:
        d = d or {}
        return cls(kind=str(d.get("kind", "")), stock=bool(d.get("stock")), n=d.get("n"),
                   num_replicas=int(d.get("num_replicas") or 1), rank=int(d.get("rank") or 0),
                   shuffle=bool(d.get("shuffle")), seed=int(d.get("seed") or 0), drop_last=bool(d.get("drop_last")),
                   num_samples=int(d.get("num_samples") or 0), replacement=bool(d.get("replacement")),
                   global_=int(d.get("global") or 0), resplit=bool(d.get("resplit")))


@dataclass
class Position:
    """One loader's position: at the start of a pass, or now (`consumed` batches into it)."""

    key: str
    started: bool = False
    format: int = FORMAT
    fingerprint: str | None = None  # what must be equal for a loader of the resumed run (datapass.fingerprint)
    epoch: int | None = None  # the sampler's epoch when the pass began
    start: RandomState = field(default_factory=RandomState)  # the random state the pass began with
    sampler: SamplerInfo = field(default_factory=lambda: SamplerInfo(""))
    batch_size: int | None = None
    drop_last: bool = False
    num_workers: int = 0
    persistent_workers: bool = False
    iterable: bool = False
    rank: int | None = None  # of the process that recorded it
    world_size: int | None = None
    length: int | None = None  # batches of the pass (None: unknown)
    now: RandomState = field(default_factory=RandomState)  # the random state when recorded
    dataset_state: Any = None  # an iterable dataset's own state_dict() (read in the main process)
    consumed: int = 0  # batches handed to the script in this pass
    done: bool = False
    per_step: int = 1  # batches per optimizer step (gradient accumulation)
    stepped: bool = False  # the pass saw optimizer steps

    def plain(self) -> dict[str, Any]:
        """As plain values, in the saved key order (`decode`'s form)."""
        if not self.started:
            return {"format": self.format, "key": self.key, "started": False}
        out: dict[str, Any] = {
            "format": self.format, "key": self.key, "started": True, "fingerprint": self.fingerprint,
            "epoch": self.epoch, "start": self.start.plain(), "sampler": self.sampler.plain(),
            "batch_size": self.batch_size, "drop_last": self.drop_last, "num_workers": self.num_workers,
            "persistent_workers": self.persistent_workers, "iterable": self.iterable, "rank": self.rank,
            "world_size": self.world_size, "length": self.length, "now": self.now.plain(),
        }
        if self.dataset_state is not None:
            out["dataset_state"] = self.dataset_state
        out.update(consumed=self.consumed, done=self.done, per_step=self.per_step, stepped=self.stepped)
        return out

    @classmethod
    def from_plain(cls, d: Mapping[str, Any]) -> Position:
        return cls(
            key=str(d.get("key", "")), started=bool(d.get("started")), format=int(d.get("format") or FORMAT),
            fingerprint=d.get("fingerprint"), epoch=d.get("epoch"), start=RandomState.from_plain(d.get("start")),
            sampler=SamplerInfo.from_plain(d.get("sampler")), batch_size=d.get("batch_size"),
            drop_last=bool(d.get("drop_last")), num_workers=int(d.get("num_workers") or 0),
            persistent_workers=bool(d.get("persistent_workers")), iterable=bool(d.get("iterable")),
            rank=d.get("rank"), world_size=d.get("world_size"), length=d.get("length"),
            now=RandomState.from_plain(d.get("now")), dataset_state=d.get("dataset_state"),
            consumed=int(d.get("consumed") or 0), done=bool(d.get("done")), per_step=int(d.get("per_step") or 1),
            stepped=bool(d.get("stepped")),
        )

    def saved(self) -> dict[str, Any]:
        return encode(self.plain())

    @classmethod
    def from_saved(cls, saved: Mapping[str, Any]) -> Position:
        return cls.from_plain(decode(saved))

    def unsplittable(self, world: int) -> bool:
        """A map-style position taken with another world size by a sampler without a job-wide order."""
        return self.world_size != world and not self.iterable and self.sampler.kind != "distributed"


def encode(rec: Mapping[str, Any]) -> dict[str, Any]:
    """A position's plain values as they are saved (see `decode`)."""
    out = dict(rec)
    if not out.get("started") or "counters" in out:
        return out
    sampler = out["sampler"] = dict(out["sampler"])
    values = [int(out.pop(k, 0) or 0) for k in _COUNTERS] + [int(sampler.pop("global", 0) or 0)]
    out["counters"] = torch.tensor(values, dtype=torch.int64)
    out["now"] = {k: as_tensor(v) for k, v in (out.get("now") or {}).items()}
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
    out["now"] = {k: as_bytes(v) for k, v in (out.get("now") or {}).items()}
    return out
