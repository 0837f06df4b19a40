"""Zero-edit truth: at which step the script's own torch.save snapshots were written, and which
one a restart loaded.

`install(shim)` wraps `torch.save` and `torch.load` (after the checkpoint interceptor, if any, so
both intercepted and plain saves pass through here; torch.save to a file object or BytesIO is
left alone):

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

The run directory must be visible to the loading rank (it is for every rank of a node; on other
nodes with a node-local run directory only rank 0's count matters to the report).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Protocol

from resctl.patching import Patches
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

    @property
    def checkpointer(self) -> PendingWrites | None: ...

    def on_resume(self, step: int, load_seconds: float = 0.0, **detail: Any) -> None: ...

_MARKS = (b'"snapshot"', b'"path"')  # only these lines can matter to the ledger
CHUNK = 8 << 20


class SnapshotTracker:
    def __init__(self, shim: SnapshotHost) -> None:
        self.shim = shim
        self.ledger = SnapshotLedger(remember=True)
        self._offsets: dict[Path, int] = {}
        self._epoch: tuple[int, int] | None = None  # (cycle, iteration) of the last optimizer step
        self._resumed: tuple[tuple[int, int], int] | None = None

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

    # -- loading -----------------------------------------------------------------------------
    def on_step(self, *_: Any) -> None:
        self._epoch = self._current()

    def _current(self) -> tuple[int, int]:
        return self.shim.events.cycle, self.shim.events.iteration

    def loaded(self, path: str, seconds: float) -> None:
        epoch = self._current()
        if self._epoch == epoch:
            return  # this epoch has made steps: an evaluation, not a resume
        try:
            ident = file_id(os.stat(path))
        except OSError:
            return
        self._catch_up()
        step = self.ledger.step_of(path, ident)
        if step is None or self._resumed == (epoch, step):
            return
        self._resumed = (epoch, step)
        self.shim.on_resume(step, load_seconds=seconds, path=path, source="torch.load")

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


def _path(f: Any) -> str | None:
    if isinstance(f, (str, os.PathLike)):
        given = os.fspath(f)
        if isinstance(given, str):
            return os.path.abspath(given)
    return None


def install(shim: SnapshotHost) -> SnapshotTracker | None:
    """Wrap torch.save/torch.load for `shim` (no run directory: nothing to record, not installed)."""
    if shim.run_dir is None:
        return None
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    tracker = SnapshotTracker(shim)
    orig_save, orig_load = torch.save, torch.load

    def save(obj: object, f: Any, *args: Any, **kwargs: Any) -> Any:
        path = _path(f)
        step, t0 = shim.step, time.monotonic()
        result = orig_save(obj, f, *args, **kwargs)
        if path is not None:
            tracker.saved(path, step, time.monotonic() - t0)
        return result

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        path = _path(f)
        t0 = time.monotonic()
        result = orig_load(f, *args, **kwargs)
        if path is not None:
            tracker.loaded(path, time.monotonic() - t0)
        return result

    save.__doc__, load.__doc__ = orig_save.__doc__, orig_load.__doc__
    shim.patches.set(torch, "save", save)
    shim.patches.set(torch, "load", load)
    shim.patches.on_undo(register_optimizer_step_post_hook(tracker.on_step).remove)
    return tracker
