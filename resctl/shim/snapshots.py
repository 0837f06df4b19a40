"""Zero-edit truth: at which step the script's own torch.save snapshots were written, and which
one a restart loaded.

`install(shim)` wraps `torch.save` and `torch.load` (after the checkpoint interceptor, if any, so
both intercepted and plain saves pass through here), safetensors' `save_file`/`load_file` (what
transformers and accelerate write model weights with), and local files opened through fsspec
(what PyTorch Lightning and Fabric write and read their checkpoints with):

- `torch.save(obj, path)` records a `snapshot` event when it returns: the optimizer steps the
  shim counted so far, the path, the time it blocked and, when the file is complete (a plain
  save, or an intercepted one already durable), its size and identity (device, inode, size,
  mtime: a later `os.replace` keeps all four);
- `torch.load(path)` before the first optimizer step of a process or in-process iteration looks
  the file up among the run's durable snapshots (`resctl.telemetry.snapshots.SnapshotLedger`
  over every rank's events, read incrementally): if this run wrote it, the shim resumes its step
  count there and records `resume` with `source="torch.load"`, so later step events carry the
  script's real step numbers and `resctl report` counts resume point, rollback and kept steps
  right. A file the run never wrote (pretrained weights) changes nothing.
- a save that is not to a path is followed to the file it lands in: into an open file (a path in its
  `name`), recorded when torch.save returns; into memory (Lightning's `torch.save(checkpoint,
  BytesIO)`, then an fsspec write of those bytes), recorded when an fsspec local file of exactly
  that size is closed or committed (`fsspec_hook`); a load from a file object with a path (`name`,
  or an fsspec file's `path`) is looked up as a load of that path. Bytes that never reach a local
  file (object stores) are not counted: resctl cannot tell when they are durable.

Scripts that checkpoint with torch.distributed.checkpoint (dcp.save, dcp.async_save, dcp.load) are followed
the same way by `resctl.shim.dcpsaves` (a checkpoint directory, named by its `.metadata`'s identity).

The run directory must be visible to the loading rank (it is for every rank of a node; on other
nodes with a node-local run directory only rank 0's count matters to the report).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol

from resctl.patching import Patches
from resctl.shim import dcpsaves, savetargets
from resctl.telemetry.events import EventLog, parse_line, rank_files
from resctl.telemetry.snapshots import SnapshotLedger, file_id


class PendingWrites(Protocol):
    def pending_path(self) -> Path | None: ...


class SnapshotHost(Protocol):
    """What the tracker needs of the worker's shim (`resctl.shim.runtime.Shim` provides it; typed
    here so this module imports nothing of the runtime)."""

    run_dir: Path | None
    events: EventLog
    patches: Patches
    step: int
    #: False while an optimizer step is not training (dcpsaves: DCP's state-making step before a load)
    counting_steps: bool
    #: (cycle, iteration) of the last optimizer step (None before the first): the shim's own step
    #: hook keeps it, so no second global hook runs every step.
    step_epoch: tuple[int, int] | None

    @property
    def checkpointer(self) -> PendingWrites | None: ...

    def on_resume(self, step: int, load_seconds: float = 0.0, **detail: Any) -> None: ...

_MARKS = (b'"snapshot"', b'"path"')  # only these lines can matter to the ledger
CHUNK = 8 << 20


@dataclass(frozen=True)
class InMemory:
    """A torch.save into memory (or into a file that is complete only when closed or committed),
    waiting for the file its bytes land in."""

    step: int
    nbytes: int
    t0: float  # time.monotonic() when the torch.save began


class SnapshotTracker:
    def __init__(self, shim: SnapshotHost) -> None:
        self.shim = shim
        self.ledger = SnapshotLedger(remember=True)
        self._offsets: dict[Path, int] = {}
        self._resumed: tuple[tuple[int, int], int] | None = None
        self.in_memory: InMemory | None = None

    @property
    def step(self) -> int:
        return self.shim.step

    @property
    def events(self) -> EventLog:
        return self.shim.events

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Optimizer steps inside are not training steps (not counted, no step event, no drill)."""
        before, self.shim.counting_steps = self.shim.counting_steps, False
        try:
            yield
        finally:
            self.shim.counting_steps = before

    # -- saving ------------------------------------------------------------------------------
    def saved(self, path: str, step: int, seconds: float) -> None:
        ckpt = self.shim.checkpointer
        pending = ckpt is not None and ckpt.pending_path() == Path(path)
        size = ident = None
        if not pending:
            try:
                st = os.stat(path)
                size, ident = st.st_size, file_id(st)
            except OSError:
                pass
        self.shim.events.emit("snapshot", step=step, path=path, seconds=round(seconds, 6), bytes=size,
                              file_id=ident, pending=pending or None)

    def saved_to_memory(self, step: int, nbytes: int, t0: float) -> None:
        self.in_memory = InMemory(step, nbytes, t0)

    def file_written(self, path: str) -> None:
        """A local file the script has just completed (fsspec close or commit): when it holds exactly
        the bytes of the last torch.save into memory, it is that snapshot, as durable as a plain save."""
        pending = self.in_memory
        if pending is None:
            return
        try:
            size = os.stat(path).st_size
        except OSError:
            return
        if size != pending.nbytes:
            return
        self.in_memory = None
        self.saved(os.path.abspath(path), pending.step, time.monotonic() - pending.t0)

    # -- loading -----------------------------------------------------------------------------
    def _current(self) -> tuple[int, int]:
        return self.shim.events.cycle, self.shim.events.iteration

    def loaded(self, path: str, seconds: float, file_object: bool = False, identity: str | None = None,
               source: str = "torch.load") -> None:
        """A load of `path` returned; `identity`: the file whose identity names it (a DCP checkpoint
        directory's `.metadata`), `path` itself by default."""
        epoch = self._current()
        if self.shim.step_epoch == epoch:
            return  # this epoch has made steps: an evaluation, not a resume
        try:
            st = os.stat(identity or path)
        except OSError:
            return
        self._catch_up()
        step = self.ledger.completed_since(path, st.st_mtime) if identity else None  # its mark written since
        if step is None:
            step = self.ledger.step_of(path, file_id(st))
        if step is None or self._resumed == (epoch, step):
            return
        self._resumed = (epoch, step)
        self.shim.on_resume(step, load_seconds=seconds, path=path, source=source)
        if file_object:
            note_unpositioned_resume(path)


    def _catch_up(self) -> None:
        """Feed the ledger what every rank appended since the last look (only candidate lines)."""
        run_dir = self.shim.run_dir
        if run_dir is None:
            return
        for path in rank_files(run_dir).values():
            try:
                with open(path, "rb") as fh:
                    while self._feed_chunk(path, fh):
                        pass
            except OSError:
                continue

    def _feed_chunk(self, path: Path, fh: Any) -> bool:
        """Feed the next whole lines of at most `CHUNK` bytes; False at the end of the file."""
        offset = self._offsets.get(path, 0)
        fh.seek(offset)
        data = fh.read(CHUNK)
        end = data.rfind(b"\n") + 1
        if end == 0:
            if len(data) < CHUNK:
                return False
            end = len(data)  # a line longer than a chunk is not a record: skip it
        self._offsets[path] = offset + end
        for line in data[:end].split(b"\n"):
            if _MARKS[0] in line or _MARKS[1] in line:
                event, _ = parse_line(line)
                if event is not None:
                    self.ledger.feed(event)
        return True


def note_unpositioned_resume(path: str) -> None:
    """With `checkpoint.data_position`, say once that a checkpoint loaded from a file object (PyTorch
    Lightning's and Fabric's way) carries no data position: its loaders start the interrupted epoch over."""
    data = sys.modules.get("resctl.checkpoint.dataposition")
    registry = getattr(data, "REGISTRY", None)
    if registry is None or not registry.auto:
        return
    first_rank = os.environ.get("RANK", "0") == "0"  # one console line per job; every rank's event
    registry.say("unpositioned", "framework", f"{os.path.basename(path)} is the framework's own checkpoint (PyTorch "
                 "Lightning and Fabric write it from rank 0 alone): it holds no data position, so the interrupted "
                 "epoch starts over; docs/frameworks.md says what resumes exactly", quiet=not first_rank)


def _path(f: Any) -> str | None:
    if isinstance(f, (str, os.PathLike)):
        given = os.fspath(f)
        if isinstance(given, str):
            return os.path.abspath(given)
    return None


def _file_path(f: Any) -> str | None:
    """The local path behind an open file: a built-in file's `name`, an fsspec local file's `path`."""
    for attr in ("path", "name"):
        value = getattr(f, attr, None)
        if isinstance(value, str) and os.path.exists(value):
            return os.path.abspath(value)
    return None


def _tell(f: Any) -> int | None:
    try:
        return int(f.tell())
    except (AttributeError, OSError, ValueError, TypeError):
        return None


def save_to_file_object(tracker: SnapshotTracker, save: Any, obj: object, f: Any, args: Any, kwargs: Any) -> Any:
    """torch.save into a file object: an open local file is a snapshot when torch.save returns (flushed);
    anything else (BytesIO, an fsspec file committed later) waits for the file its bytes land in."""
    step, t0, before = tracker.shim.step, time.monotonic(), _tell(f)
    result = save(obj, f, *args, **kwargs)
    after = _tell(f)
    if isinstance(getattr(f, "name", None), str) and hasattr(f, "fileno") and not hasattr(f, "fs"):
        try:
            f.flush()
        except (OSError, ValueError):
            return result
        path = _file_path(f)
        if path is not None:
            tracker.saved(path, step, time.monotonic() - t0)
        return result
    if before is not None and after is not None and after > before:
        tracker.saved_to_memory(step, after, t0)  # the whole buffer is what gets written
    return result


def install(shim: SnapshotHost) -> SnapshotTracker | None:
    """Wrap torch.save/torch.load for `shim` (no run directory: nothing to record, not installed)."""
    if shim.run_dir is None:
        return None
    import torch
    tracker = SnapshotTracker(shim)
    orig_save, orig_load = torch.save, torch.load

    def save(obj: object, f: Any, *args: Any, **kwargs: Any) -> Any:
        path = _path(f)
        if path is None:
            return save_to_file_object(tracker, orig_save, obj, f, args, kwargs)
        step, t0 = shim.step, time.monotonic()
        result = orig_save(obj, f, *args, **kwargs)
        tracker.saved(path, step, time.monotonic() - t0)
        return result

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        path = _path(f)
        from_file = _file_path(f) if path is None else None
        t0 = time.monotonic()
        result = orig_load(f, *args, **kwargs)
        if path is not None or from_file is not None:
            tracker.loaded(path or from_file or "", time.monotonic() - t0, file_object=from_file is not None)
        return result

    save.__doc__, load.__doc__ = orig_save.__doc__, orig_load.__doc__
    shim.patches.set(torch, "save", save)
    shim.patches.set(torch, "load", load)
    savetargets.install(tracker, shim.patches)
    dcpsaves.install(tracker, shim.patches)
    return tracker
