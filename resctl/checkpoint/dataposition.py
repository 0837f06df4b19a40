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

The rooms: `dataorder` (the index arithmetic, pure), `datarecord` (the typed `Position` and its saved
form), `datapass` (a loader's pass recorded and resumed: `Track`) and this module (the tracked loaders,
the DataLoader patches, the checkpoint entries). The events log and the torch.save intercept's extras
are handed in at install (`install`, `install_auto`, `with_positions`), never fetched from
`resctl.checkpoint`'s default checkpointer.

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

import weakref
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader, Sampler

from resctl import console
from resctl.checkpoint.dataorder import batched, global_order, random_order, resplit, skip_into
from resctl.checkpoint.datapass import (
    OVERRIDE,
    DataPositionMismatch,
    Steps,
    Track,
    describe_sampler,
    fingerprint,
    world,
)
from resctl.checkpoint.datarecord import FORMAT, Position, decode, encode
from resctl.checkpoint.state import DATA_POSITION, is_stateful
from resctl.patching import Patches
from resctl.telemetry.events import EventLog

_Steps = Steps  # the old name (tests/unit/test_data_position.py)

__all__ = [
    "DATA_POSITION",
    "FORMAT",
    "REGISTRY",
    "DataPositionMismatch",
    "batched",
    "copy_back",
    "decode",
    "describe_sampler",
    "encode",
    "entry_for",
    "global_order",
    "install",
    "random_order",
    "resplit",
    "skip_into",
    "uninstall",
    "with_positions",
]


# --- the registry of tracked loaders and the patches ------------------------------------------


class Registry:
    """Tracked loaders (weakly), the positions loaded for the zero-edit entry, and how to talk."""

    def __init__(self) -> None:
        self.tracks: weakref.WeakKeyDictionary[DataLoader[Any], Track] = weakref.WeakKeyDictionary()
        self.samplers: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self.auto = False
        self.waiting: list[Position] = []  # zero-edit positions not yet claimed by a loader
        self.by_key: dict[str, Position] = {}  # explicit positions loaded before their loader iterated
        self.said: set[tuple[str, str]] = set()
        self.events: EventLog | None = None  # handed in at install (`install`, `install_auto`, `entry_for`)
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
        if not quiet or (action == "resumed" and world()[0] == 0):  # one line per job for a resume
            console.line(f"resctl: data position: {message}")
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
            track = self.tracks[loader] = Track(key, weakref.ref(loader), self)
            if key.startswith("#"):
                self._claim(track, loader)
            else:
                track.pending = self.by_key.pop(key, None)
        return track

    def _claim(self, track: Track, loader: DataLoader[Any]) -> None:
        """The waiting position of `loader`: the first of its fingerprint; else, with another world size,
        the first one that cannot be re-split (its loader's fingerprint changes with the world size when
        it reads a per-rank shard: the resume is refused rather than silently started over)."""
        fp, size = fingerprint(loader), world()[1]
        match = next((i for i, rec in enumerate(self.waiting) if rec.fingerprint == fp), None)
        if match is None:
            match = next((i for i, rec in enumerate(self.waiting) if rec.unsplittable(size)), None)
        if match is not None:
            track.pending = self.waiting.pop(match)
            track.pending.key = track.key

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
        rank, size = world()
        loaders = [t.position() for loader, t in list(self.tracks.items())
                   if id(loader) not in skip and t.key.startswith("#")]
        return {"format": FORMAT, "rank": rank, "world_size": size,
                "loaders": loaders + [rec.saved() for rec in self.waiting]}

    def load_auto(self, saved: Mapping[str, Any]) -> None:
        if not isinstance(saved, Mapping) or saved.get("format") != FORMAT:
            raise DataPositionMismatch(f"the checkpoint's data position has format {saved.get('format')!r}; "
                                       f"this resctl reads {FORMAT}: set checkpoint.data_position = false")
        self.waiting = [Position.from_saved(rec) for rec in saved.get("loaders", []) if rec.get("started")]
        for loader, track in list(self.tracks.items()):  # loaders iterated before the load
            if track.key.startswith("#"):
                track.pending = None
                self._claim(track, loader)

    def own_index_sampler(self, loader: DataLoader[Any]) -> Any:
        return _index_sampler_of(loader)


REGISTRY = Registry()
_PATCHES = Patches("dataposition")
_ORIGINAL_INDEX_SAMPLER: property | None = None


def install(events: EventLog | None = None) -> Patches:
    """Patch DataLoader.__iter__ and `_index_sampler` (idempotent; `uninstall` undoes); the notes go
    to `events` too (the first log handed in stays)."""
    global _ORIGINAL_INDEX_SAMPLER
    if REGISTRY.events is None:
        REGISTRY.events = events
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
        override = self.__dict__.get(OVERRIDE)
        return override if override is not None else _index_sampler_of(self)

    _PATCHES.set(DataLoader, "__iter__", __iter__)
    _PATCHES.set(DataLoader, "_index_sampler", property(index_sampler))
    _PATCHES.on_undo(register_optimizer_step_post_hook(Steps.hook).remove)
    return _PATCHES


def _index_sampler_of(loader: DataLoader[Any]) -> Any:
    """The loader's own index sampler (what DataLoader._index_sampler returns unpatched)."""
    prop = _ORIGINAL_INDEX_SAMPLER
    assert prop is not None and prop.fget is not None, "dataposition.install() first"
    return prop.fget(loader)


Extras = MutableMapping[str, tuple[Callable[[], Any], Callable[[Any], None]]]
_extras: Extras | None = None  # where install_auto registered the snapshots' entry


def uninstall() -> None:
    global _extras
    _PATCHES.undo()
    REGISTRY.auto = False
    REGISTRY.events = None
    if _extras is not None:
        _extras.pop(DATA_POSITION, None)
        _extras = None


def install_auto(events: EventLog | None = None, extras: Extras | None = None) -> Callable[[], None]:
    """Zero-edit mode (the shim, `checkpoint.data_position = true`): every loader the script iterates is
    tracked and saved with every `resctl.checkpoint` save and, given the torch.save intercept's `extras`
    (`intercept.EXTRAS`), beside every intercepted snapshot; returns the undo."""
    global _extras
    install()
    REGISTRY.auto, REGISTRY.events = True, events
    if extras is not None:
        extras[DATA_POSITION] = (lambda: REGISTRY.auto_state(set()), REGISTRY.load_auto)
        _extras = extras
    return uninstall


# --- checkpoint entries ----------------------------------------------------------------------


class LoaderEntry:
    """A loader (or a sampler: the loader iterating it) as a checkpoint `state` entry."""

    resctl_per_rank = True  # every rank saves its own position (`resctl.checkpoint.rankside`)

    def __init__(self, key: str, obj: Any, events: EventLog | None = None) -> None:
        install(events)  # the notes go to the run's events too (the checkpointer's log, handed in)
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
            return (REGISTRY.by_key.get(self.key) or Position(self.key)).saved()
        return track.position()

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        track = self._track()
        if track is None:  # the sampler's loader takes it when it first iterates (`Registry.track`)
            REGISTRY.by_key[self.key] = Position.from_saved(saved)
        else:
            track.pending = Position.from_saved(saved)


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


def entry_for(key: str, value: Any, events: EventLog | None = None) -> LoaderEntry:
    """The entry of `value` under `key` (one per pair: `maybe_save` asks every step)."""
    entry = _ENTRIES.get((key, id(value)))
    if entry is None or entry._ref() is not value:
        entry = _ENTRIES[(key, id(value))] = LoaderEntry(key, value, events)
    return entry


def with_positions(state: MutableMapping[str, Any], events: EventLog | None = None) -> MutableMapping[str, Any]:
    """`state` as the engine should see it: its loaders and samplers as position entries and, in
    zero-edit mode, every other loader of the script under `DATA_POSITION`; `state` itself when
    there is nothing to add. Asked at every `maybe_save`: the common case is one dict lookup per entry.
    `events`: the checkpointer's log, for the notes of a loader seen for the first time."""
    kinds = _KINDS
    for value in state.values():
        kind = kinds.get(type(value))
        if kind is None:
            kind = _kind(value)
        if kind:
            return _with_entries(state, events)
    if not REGISTRY.auto or DATA_POSITION in state:
        return state
    full = dict(state)
    full[DATA_POSITION] = _AUTO
    return full


def _with_entries(state: MutableMapping[str, Any], events: EventLog | None) -> MutableMapping[str, Any]:
    full = dict(state)
    skip = set()
    for name, value in state.items():
        kind = _kind(value)
        if kind == _DATA:
            full[name] = entry_for(str(name), value, events)
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
