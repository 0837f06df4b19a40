"""Zero-edit checkpointing: make `torch.save` to chosen paths async and atomic.

`install(glob, queue)` replaces `torch.save` and `torch.load`; `queue` is the engine's write queue
(`Checkpointer.writes`, seen here only as the `resctl.checkpoint.writes.WriteQueue` protocol):

- `torch.save(obj, path)` with `path` matching `glob` snapshots `obj` (tensors copied to CPU),
  returns, and writes in the write queue's background thread: into a hidden temp file next to
  `path`, fsync, then a sidecar manifest `<path>.resctl.json` (size and CRC32), then both are
  renamed into place and the directory is fsynced. The file at `path` is a normal torch.save
  file, appears only when complete, and any program can torch.load it.
- `torch.load(path)` of a matching path first waits for that path's pending write, then checks
  the sidecar (if there is one) and raises `CheckpointError` on a size or checksum mismatch.
- Every other call (other paths, file objects, BytesIO) goes straight to torch.

`EXTRAS` adds state of resctl's own beside every snapshot (the data position, with
`checkpoint.data_position`): each `produce()` runs when torch.save is called, the values go to
`<path>.resctl-extra-<CRC32 of the file>.pt` (with its own sidecar), renamed into place before the
file, so it belongs to exactly one version of it; a verified torch.load of the path hands each value
to its `consume`. Extras of older versions are removed after the rename.

Temp files of writes that a kill interrupted (`.<name>.resctl-tmp-*`) are removed from the glob's
directory at `install` and from any directory before the first write into it.

The glob is matched (fnmatch) against the path as given and against its absolute form, so both
`"checkpoints/*.pt"` and `"/fsx/run1/**"`-style globs work. Saves go through the write queue's
single in-flight slot: a new save waits for the previous one, and a failed write raises on the
next save or wait. The write is one `torch.save` stream (not split across writers): use
`resctl.checkpoint.save` for full parallel bandwidth.
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any, Callable

import torch

from resctl.checkpoint import format as fmt
from resctl.checkpoint import state as st
from resctl.checkpoint.errors import CheckpointError
from resctl.checkpoint.writes import WriteQueue
from resctl.patching import Patches

SIDECAR_SUFFIX = ".resctl.json"
EXTRA_MARK = ".resctl-extra-"
#: name -> (produce() -> a weights_only-safe value, consume(value)): saved beside every snapshot.
EXTRAS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}
TMP_MARK = ".resctl-tmp-"
_cleaned_dirs: set[str] = set()
# Temp files older than this process are leftovers of a killed one; newer ones may be another live
# rank's write in progress (ranks of one job can save into one directory).
_STARTED = time.time()
_PLAIN = (int, float, bool, complex, str, bytes, type(None), torch.dtype, torch.device, torch.Size)

#: torch.save/torch.load while installed (one install at a time: a second replaces the first).
_PATCHES = Patches("checkpoint.intercept")


def install(glob: str, queue: WriteQueue) -> None:
    """Patch torch.save/torch.load for paths matching `glob`, writing through `queue` (the
    checkpointer's `writes`, handed in by whoever installs: the shim, a test)."""
    uninstall()
    orig_save, orig_load = torch.save, torch.load
    if queue.rank == 0:
        remove_leftovers(Path(os.path.dirname(os.path.abspath(re.split(r"[*?\[]", glob)[0] + "x"))))

    def save(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
        path = _matching_path(f, glob)
        if path is None:
            return orig_save(obj, f, *args, **kwargs)
        _save_path(queue, orig_save, obj, path, args, kwargs)
        return None

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        path = _matching_path(f, glob)
        if path is not None:
            if queue.pending_path() == path:
                queue.wait_previous()
            verify(path)
            obj = orig_load(f, *args, **kwargs)
            _consume_extras(path, orig_load)
            return obj
        return orig_load(f, *args, **kwargs)

    save.__doc__ = orig_save.__doc__
    load.__doc__ = orig_load.__doc__
    _PATCHES.set(torch, "save", save)
    _PATCHES.set(torch, "load", load)


def uninstall() -> None:
    """Restore the original torch.save/torch.load (pending writes keep running)."""
    _PATCHES.undo()


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


def remove_leftovers(directory: Path) -> int:
    """Remove the temp files of interrupted intercepted writes in `directory` (once per process
    and directory, before our first write there; only files older than this process); return how many."""
    key = os.path.realpath(directory)
    if key in _cleaned_dirs:
        return 0
    _cleaned_dirs.add(key)
    removed = 0
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return 0
    for entry in entries:
        if entry.name.startswith(".") and TMP_MARK in entry.name and entry.is_file(follow_symlinks=False):
            try:
                if entry.stat().st_mtime >= _STARTED:
                    continue
                os.unlink(entry.path)
                removed += 1
            except FileNotFoundError:
                pass
    return removed


def verify(path: Path) -> None:
    """Raise CheckpointError if `path` does not match its sidecar manifest (no sidecar: no check)."""
    try:
        manifest = fmt.read_manifest(sidecar(path), path.name)
    except fmt.CorruptCheckpoint as err:
        if "no manifest" in str(err):
            return
        raise CheckpointError(f"{path}: {err}") from None
    if not path.exists():
        return
    entry = manifest.files.get(path.name)
    size, crc = fmt.file_crc(path)
    if manifest.kind != "file" or entry is None or size != entry.bytes or crc != entry.crc32:
        raise CheckpointError(
            f"{path} does not match its manifest {sidecar(path).name} (corrupt or changed outside resctl); "
            "load an older checkpoint or delete both files"
        )


def extra_path(path: Path, crc: int) -> Path:
    """Where the extras of the version of `path` with checksum `crc` are kept."""
    return path.with_name(f"{path.name}{EXTRA_MARK}{crc:08x}.pt")


def _consume_extras(path: Path, orig_load: Callable[..., Any]) -> None:
    """Hand the values saved beside this version of `path` (verified) to `EXTRAS`."""
    if not EXTRAS:
        return
    try:
        entry = fmt.read_manifest(sidecar(path), path.name).files.get(path.name)
    except fmt.CorruptCheckpoint:
        return
    if entry is None or entry.crc32 is None or not extra_path(path, entry.crc32).exists():
        return
    extra = extra_path(path, entry.crc32)
    verify(extra)
    values = orig_load(extra, weights_only=True)
    for name, (_, consume) in EXTRAS.items():
        if name in values:
            consume(values[name])


def _write_extra(path: Path, crc: int, data: bytes, tag: str) -> None:
    """The extras of the version of `path` with checksum `crc`, complete before that version appears."""
    extra = extra_path(path, crc)
    tmp = path.with_name(f".{extra.name}{TMP_MARK}{tag}")
    tmp_manifest = path.with_name(f".{extra.name}{TMP_MARK}{tag}.json")
    try:
        size, ecrc = fmt.write_file(tmp, [memoryview(data)], None)
        fmt.write_manifest(tmp_manifest, fmt.Manifest("file", None, {extra.name: fmt.FileEntry(size, ecrc)},
                                                      created=time.time()))
        os.rename(tmp, extra)
        os.rename(tmp_manifest, sidecar(extra))
    finally:
        for leftover in (tmp, tmp_manifest):
            if leftover.exists():
                os.unlink(leftover)


def _remove_old_extras(path: Path, keep: int | None) -> None:
    for old in path.parent.glob(f"{glob_escape(path.name)}{EXTRA_MARK}*"):
        if keep is None or not old.name.startswith(extra_path(path, keep).name):
            try:
                os.unlink(old)
            except FileNotFoundError:
                pass


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _matching_path(f: Any, glob: str) -> Path | None:
    if not isinstance(f, (str, os.PathLike)):
        return None
    given = os.fspath(f)
    if isinstance(given, bytes):
        return None
    absolute = os.path.abspath(given)
    pattern_abs = os.path.abspath(glob) if not os.path.isabs(glob) else glob
    if fnmatch.fnmatch(given, glob) or fnmatch.fnmatch(absolute, glob) or fnmatch.fnmatch(absolute, pattern_abs):
        return Path(absolute)
    return None


def _snapshot(obj: Any, orig_save: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A copy of `obj` the training loop cannot change: containers of tensors are rebuilt around
    CPU clones; anything else is serialised to bytes now (same bytes torch.save would write)."""
    tensors: list[torch.Tensor] = []
    structure = st.flatten(obj, tensors, {})
    if _all_plain(structure):
        clones: list[torch.Tensor] = []
        for t in tensors:
            c = t.detach().to("cpu", copy=True)
            clones.append(torch.nn.Parameter(c, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else c)
        return st.unflatten(structure, clones)
    buf = io.BytesIO()
    orig_save(obj, buf, *args, **kwargs)
    return buf.getvalue()


def _all_plain(obj: Any) -> bool:
    if isinstance(obj, dict):
        return all(_all_plain(v) for v in obj.values()) and all(isinstance(k, _PLAIN) for k in obj)
    if isinstance(obj, (list, tuple)):
        if len(obj) == 2 and obj[0] == fmt.TENSOR_MARK:
            return True
        return all(_all_plain(v) for v in obj)
    return isinstance(obj, _PLAIN)


def _guess_step(obj: Any) -> int | None:
    if isinstance(obj, dict):
        for key in ("step", "global_step", "iteration", "iter"):
            if isinstance(obj.get(key), int):
                return int(obj[key])
    return None


def _save_path(
    queue: WriteQueue,
    orig_save: Callable[..., Any],
    obj: Any,
    path: Path,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    t0 = time.monotonic()
    waited = queue.begin()
    snap = _snapshot(obj, orig_save, args, kwargs)
    staged_at = time.monotonic()
    step = _guess_step(obj)
    fail = queue.take_injected_failure()
    extras = {name: produce() for name, (produce, _) in EXTRAS.items()}
    extra_bytes = b""
    if extras:
        buf = io.BytesIO()
        orig_save(extras, buf)
        extra_bytes = buf.getvalue()

    def job() -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_leftovers(path.parent)
        tag = secrets.token_hex(4)
        tmp = path.with_name(f".{path.name}{TMP_MARK}{tag}")
        tmp_manifest = path.with_name(f".{path.name}{TMP_MARK}{tag}.json")
        try:
            if isinstance(snap, bytes):
                size, crc = fmt.write_file(tmp, [memoryview(snap)], queue.tick)
            else:
                with open(tmp, "wb") as fh:
                    orig_save(snap, fh, *args, **kwargs)
                    fh.flush()
                    os.fsync(fh.fileno())
                size, crc = fmt.file_crc(tmp)  # just written: read back from the page cache
            if fail is not None:
                raise RuntimeError(fail)
            if extra_bytes:
                _write_extra(path, crc, extra_bytes, tag)
            manifest = fmt.Manifest("file", step, {path.name: fmt.FileEntry(size, crc)}, created=time.time(),
                                    run_id=queue.run_id)
            fmt.write_manifest(tmp_manifest, manifest)
            # An old sidecar must not vouch for the new file, even for an instant.
            try:
                os.unlink(sidecar(path))
            except FileNotFoundError:
                pass
            os.rename(tmp, path)
            os.rename(tmp_manifest, sidecar(path))
            fmt.fsync_dir(path.parent)
            if extra_bytes or EXTRAS:
                _remove_old_extras(path, crc if extra_bytes else None)
        except BaseException:
            for leftover in (tmp, tmp_manifest):
                try:
                    os.unlink(leftover)
                except FileNotFoundError:
                    pass
            raise
        queue.events.emit("ckpt_persist", step=step, seconds=round(time.monotonic() - staged_at, 6), bytes=size,
                         path=str(path))

    queue.submit(job, step, path)
    queue.events.emit("ckpt_stall", step=step, seconds=round(time.monotonic() - t0, 6), waited=round(waited, 6),
                      path=str(path))
    queue.end()


__all__ = ["install", "uninstall", "verify", "sidecar", "remove_leftovers"]
