"""Zero-edit truth for scripts that checkpoint with torch.distributed.checkpoint (DCP) themselves.

torchtitan-, accelerate- and Lightning-FSDP-style code saves sharded state with `dcp.save` (or
`dcp.async_save`) into a directory per checkpoint (`checkpoint_id`, or a `FileSystemWriter`'s path) and
resumes with `dcp.load`. Each rank writes its own shards; rank 0 writes DCP's `.metadata` last, once
every rank's files are in place, so the directory is a complete checkpoint once `.metadata` is there.
`install` wraps the three calls of the `torch.distributed.checkpoint` package (when it is imported, so a
script that never imports it pays nothing: ~0.5 s) and records, in the events `resctl report` reads:

- `dcp.save`: a `snapshot` when it returns (every rank: the collective returns once `.metadata` is
  written): the optimizer steps the shim counted when it was called, the directory, the time it blocked,
  the directory's bytes and the identity (device, inode, size, mtime) of its `.metadata`;
- `dcp.async_save`: `ckpt_stall` with the directory when it returns (the staging that blocked the
  loop), a pending `snapshot` at the step, and `ckpt_persist` with the directory when its future
  completes (durable then; one that fails never is): the same records as an intercepted torch.save;
- `dcp.load` before the first optimizer step of a process or in-process iteration: the directory's
  `.metadata` is looked up among the run's durable saves (`SnapshotTracker`); a checkpoint this run
  wrote resumes the shim's step count at its step (`resume`, `source="dcp.load"`). An async save with
  no `ckpt_persist` counts when its `.metadata` was written after it began: a rank killed in the
  collective that ends the save (after rank 0 wrote `.metadata`) leaves every future unfinished or
  failed, yet the directory is whole and the restarted script loads it. The report counts such a save
  as the resume point and among the checkpoints made, durable as of the load.

Not seen: saves through DCP's lower-level or deprecated entry points (`save_state_dict`,
`_save_state_dict`, a bound `state_dict_saver.save`), storage other than the local filesystem (an
fsspec URL: resctl cannot tell when it is durable), and resctl's own sharded checkpoints (their caller
is resctl: `resctl.checkpoint` records them itself).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, ContextManager, Protocol

from resctl.patching import Patches
from resctl.shim.savetargets import AfterImport
from resctl.telemetry.snapshots import file_id

MODULE = "torch.distributed.checkpoint"
STATE_DICT = "torch.distributed.checkpoint.state_dict"
#: torch's private helper that steps a fresh optimizer (zero gradients, zero learning rate) to make its state
#: before `get_state_dict`/`set_state_dict` (torch 2.13); without it nothing is wrapped (that step is counted).
INIT_OPTIM = "_init_optim_state"
METADATA = ".metadata"  # DCP's global metadata file, written last by rank 0


class Events(Protocol):
    def emit(self, kind: str, **fields: Any) -> None: ...


class Tracker(Protocol):
    """What the wrappers report to (`resctl.shim.snapshots.SnapshotTracker`)."""

    @property
    def step(self) -> int: ...

    @property
    def events(self) -> Events: ...

    def loaded(self, path: str, seconds: float, file_object: bool = False, identity: str | None = None,
               source: str = "torch.load") -> None: ...

    def uncounted(self) -> ContextManager[None]: ...


def install(tracker: Tracker, patches: Patches) -> None:
    """Wrap DCP's save, async_save and load once the package is imported, and the optimizer-state helper
    of its `state_dict` module once that is (now, if it already is)."""
    for module, wrap in ((MODULE, _wrap), (STATE_DICT, _wrap_init)):
        if module in sys.modules:
            wrap(tracker, patches)
            continue
        finder = AfterImport(module, functools.partial(wrap, tracker, patches))
        sys.meta_path.insert(0, finder)
        patches.on_undo(finder.remove)


def _wrap_init(tracker: Tracker, patches: Patches) -> None:
    """`get_state_dict`/`set_state_dict` of a fresh optimizer (a script about to `dcp.load` into it) step it
    once with a zero learning rate to make its state: not a training step. Counted, it would put the
    shim's step count one ahead and make the load look like an evaluation (steps made), not a resume."""
    module = sys.modules[STATE_DICT]
    original = getattr(module, INIT_OPTIM, None)
    if not callable(original):
        return

    def init_optim_state(optim: Any) -> None:
        with tracker.uncounted():
            original(optim)

    patches.set(module, INIT_OPTIM, init_optim_state)


def checkpoint_dir(checkpoint_id: Any, storage: Any) -> str | None:
    """The local directory a DCP call writes or reads: `checkpoint_id`, else the storage writer's or
    reader's `path`; None for anything else (a URL, a key of another store)."""
    where = checkpoint_id if checkpoint_id is not None else getattr(storage, "path", None)
    if not isinstance(where, (str, os.PathLike)):
        return None
    text = os.fspath(where)
    if not isinstance(text, str) or "://" in text:
        return None
    return os.path.abspath(text)


def _by_resctl() -> bool:
    """Is the caller of the wrapper resctl itself (its sharded checkpoints, recorded by the engine)?"""
    caller = sys._getframe(2)
    return str(caller.f_globals.get("__name__", "")).startswith("resctl.")


def _wrap(tracker: Tracker, patches: Patches) -> None:
    dcp = sys.modules[MODULE]
    orig_save, orig_async, orig_load = dcp.save, dcp.async_save, dcp.load

    def save(state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        path = None if _by_resctl() else checkpoint_dir(kwargs.get("checkpoint_id"), kwargs.get("storage_writer"))
        step, t0 = tracker.step, time.monotonic()
        result = orig_save(state_dict, *args, **kwargs)
        if path is not None:
            saved(tracker.events, path, step, time.monotonic() - t0)
        return result

    def async_save(state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        path = None if _by_resctl() else checkpoint_dir(kwargs.get("checkpoint_id"), kwargs.get("storage_writer"))
        step, t0 = tracker.step, time.monotonic()
        result = orig_async(state_dict, *args, **kwargs)
        if path is not None:
            staged(tracker.events, path, step, t0, getattr(result, "upload_completion", result))
        return result

    def load(state_dict: Any, *args: Any, **kwargs: Any) -> Any:
        path = None if _by_resctl() else checkpoint_dir(kwargs.get("checkpoint_id"), kwargs.get("storage_reader"))
        t0 = time.monotonic()
        result = orig_load(state_dict, *args, **kwargs)
        if path is not None:
            tracker.loaded(path, time.monotonic() - t0, identity=os.path.join(path, METADATA), source="dcp.load")
        return result

    patches.on_undo(settle)
    for name, wrapper, orig in (("save", save, orig_save), ("async_save", async_save, orig_async),
                                ("load", load, orig_load)):
        wrapper.__doc__ = orig.__doc__
        patches.set(dcp, name, wrapper)


def _identity(path: str) -> tuple[int | None, str | None]:
    """(the directory's bytes, its `.metadata`'s identity); (None, None) when it has no `.metadata`."""
    try:
        ident = file_id(os.stat(os.path.join(path, METADATA)))
        total = sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
    except OSError:
        return None, None
    return total, ident


def saved(events: Events, path: str, step: int, seconds: float) -> None:
    """A synchronous `dcp.save` returned: durable now (a plain snapshot)."""
    size, ident = _identity(path)
    events.emit("snapshot", step=step, path=path, seconds=round(seconds, 6), bytes=size, file_id=ident)


def staged(events: Events, path: str, step: int, t0: float, future: Any) -> None:
    """`dcp.async_save` returned (staged): the loop's stall now, durable when `future` completes."""
    now = time.monotonic()
    events.emit("ckpt_stall", step=step, seconds=round(now - t0, 6), waited=0.0, path=path)
    events.emit("snapshot", step=step, path=path, seconds=round(now - t0, 6), bytes=None, file_id=None, pending=True)
    if isinstance(future, Future):
        done = _once(future, _on_done(events, path, step, now))
        future.add_done_callback(done)


#: Staged async saves whose `ckpt_persist` is not written yet, by id of their future: `Future.result()` returns as
#: soon as the result is set, before the done callbacks run in the writer's thread, so a script that waits for its
#: save and ends at once would leave the report without it; `settle` writes it at the worker's end.
_PENDING: dict[int, tuple[Future[Any], Callable[[Future[Any]], None]]] = {}
_LOCK = threading.Lock()


def _once(future: Future[Any], write: Callable[[Future[Any]], None]) -> Callable[[Future[Any]], None]:
    def done(fut: Future[Any]) -> None:
        with _LOCK:  # the write too: a `settle` that finds the writer's thread mid-write waits for its event
            if _PENDING.pop(id(fut), None) is None:
                return  # settled already
            write(fut)

    with _LOCK:
        _PENDING[id(future)] = (future, done)
    return done


def settle() -> None:
    """Write the `ckpt_persist` of every staged save whose future is done but whose callback has not run yet
    (the worker ends, or the shim is undone): once each, whoever comes first; one the writer's thread is writing
    is written when this returns (both write under `_LOCK`)."""
    with _LOCK:
        ready = [(fut, done) for fut, done in _PENDING.values() if fut.done()]
    for fut, done in ready:
        done(fut)


def _on_done(events: Events, path: str, step: int, staged_at: float) -> Callable[[Future[Any]], None]:
    def done(future: Future[Any]) -> None:
        if future.cancelled() or future.exception() is not None:
            return  # never durable: the report does not count it
        size, _ = _identity(path)
        events.emit("ckpt_persist", step=step, seconds=round(time.monotonic() - staged_at, 6), bytes=size,
                    path=path)

    return done
