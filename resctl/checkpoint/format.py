"""On-disk format of a resctl checkpoint, and the helpers that read and write it.

A checkpoint directory looks like this::

    <dir>/
      step-000000100/            complete: renamed into place only after everything below is durable
        data-0.bin ... data-3.bin   raw tensor bytes, one contiguous byte range of the "stream" each
        meta.pt                  the state's structure (tensors replaced by placeholders), torch.save'd
        manifest.json            written last: sizes and CRC32s of every file, tensor layout, step
      .tmp-step-000000200-...    being written (never loaded; removed by the next writer)
      .trash-...                 being pruned (never loaded)
      .recycle-...               a pruned checkpoint whose files the next write overwrites

The *stream* is every tensor of the state, laid end to end at 64-byte-aligned offsets (zero
padding in between). It is cut into `writers` equal byte ranges, one file each, so every writer
thread gets the same amount of work whatever the tensor sizes are. Tensor data is raw bytes in
native (little-endian) order: nothing in a data file is ever unpickled. `meta.pt` holds only
containers and plain values and is always loaded with `torch.load(..., weights_only=True)`.

`manifest.json` is `{"crc32": C, "body": {...}}` where C is the CRC32 of the body serialised with
sorted keys and no whitespace, so a flipped byte in the manifest itself is detected too.
"""

from __future__ import annotations

import io
import json
import os
import re
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, cast

import torch

FORMAT = "resctl-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
META = "meta.pt"
ALIGN = 64
CHUNK = 64 << 20  # bytes per write()/crc32() call: large enough for full disk speed, small enough to heartbeat
STEP_DIR_RE = re.compile(r"^step-(\d+)$")
TENSOR_MARK = "__resctl_tensor__"


class CorruptCheckpoint(Exception):
    """A checkpoint that must not be loaded; `str()` says why (used as the `ckpt_skip` reason)."""


def step_dir_name(step: int) -> str:
    return f"step-{step:09d}"


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dtype, torch.dtype):
        raise CorruptCheckpoint(f"unknown dtype {name!r}")
    return dtype


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lives in the stream."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> list[Any]:
        return [self.offset, self.nbytes, self.dtype, list(self.shape)]

    @classmethod
    def from_json(cls, raw: list[Any]) -> TensorSpec:
        offset, nbytes, dtype, shape = raw
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (offset, nbytes, *shape)):
            raise CorruptCheckpoint(f"manifest: bad tensor entry {raw!r}")
        return cls(offset, nbytes, str(dtype), tuple(shape))


def plan_stream(tensors: list[torch.Tensor]) -> tuple[list[TensorSpec], int]:
    """Offsets of `tensors` in the stream, and the stream's total length."""
    specs: list[TensorSpec] = []
    pos = 0
    for t in tensors:
        n = t.numel() * t.element_size()
        specs.append(TensorSpec(pos, n, dtype_name(t.dtype), tuple(t.shape)))
        pos = align(pos + n)
    return specs, pos


def split_ranges(total: int, writers: int, min_bytes: int = 8 << 20) -> list[tuple[int, int]]:
    """Cut [0, total) into at most `writers` aligned ranges of near-equal size (at least `min_bytes`
    each, so a small state is not scattered over many tiny files)."""
    if total == 0:
        return [(0, 0)]
    n = max(1, min(writers, total // max(min_bytes, 1)))
    bounds = [0] + [align(total * i // n) for i in range(1, n)] + [total]
    return [(lo, hi) for lo, hi in zip(bounds, bounds[1:]) if hi > lo]


def byte_view(t: torch.Tensor) -> memoryview:
    """A writable memoryview on the bytes of a contiguous CPU tensor (no copy).

    The view holds a reference to the tensor's storage (through numpy), so a thread still using it
    can never write into freed memory, whatever its creator did meanwhile."""
    if t.numel() == 0:
        return memoryview(bytearray(0))
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous CPU tensor")
    array: Any = t.detach().reshape(-1).view(torch.uint8).numpy()
    return memoryview(array).cast("B")


# --- files -------------------------------------------------------------------------------------


def fsync_dir(path: str | os.PathLike[str]) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(
    path: str | os.PathLike[str], parts: list[memoryview], tick: Callable[[], None] | None = None
) -> tuple[int, int]:
    """Write `parts` to a file (new, or an old one overwritten in place and cut to the new size),
    fsync it, and return (bytes, crc32).

    The checksum is taken chunk by chunk while writing; zlib.crc32 and os.write both release the
    GIL on large buffers, so several of these run in parallel threads.
    """
    crc = 0
    size = 0
    # No O_TRUNC: a recycled file keeps its blocks (no free + reallocate, no TRIM on `discard` mounts).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for part in parts:
            for lo in range(0, len(part), CHUNK):
                chunk = part[lo : lo + CHUNK]
                crc = zlib.crc32(chunk, crc)
                done = 0
                while done < len(chunk):
                    done += os.write(fd, chunk[done:])
                size += len(chunk)
                if tick is not None:
                    tick()
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size, crc


class Cancelled(Exception):
    """A read stopped because another file of the same checkpoint failed."""


def read_range_into(
    path: Path,
    start: int,
    end: int,
    specs: list[TensorSpec],
    views: list[memoryview],
    tick: Callable[[], None] | None = None,
    cancel: threading.Event | None = None,
) -> int:
    """Read a data file holding stream bytes [start, end) into the buffers it covers (one per
    spec, each a view that keeps its buffer alive); return its crc32. Stops with `Cancelled` soon
    after `cancel` is set. Raises CorruptCheckpoint when the file is shorter or longer."""
    crc = 0
    pos = start
    with open(path, "rb", buffering=1 << 20) as raw:
        fh = cast(io.BufferedReader, raw)  # a non-literal buffering makes typeshed say BinaryIO

        def skip_to(target: int) -> None:
            nonlocal crc, pos
            gap = fh.read(target - pos)
            if len(gap) != target - pos:
                raise CorruptCheckpoint(f"{path.name}: shorter than its manifest says")
            crc = zlib.crc32(gap, crc)
            pos = target

        for spec, view in zip(specs, views):
            lo, hi = max(spec.offset, start), min(spec.offset + spec.nbytes, end)
            if lo >= hi:
                continue
            if lo > pos:
                skip_to(lo)
            target = view[lo - spec.offset : hi - spec.offset]
            for clo in range(0, len(target), CHUNK):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(path.name)
                sub = target[clo : clo + CHUNK]
                got = fh.readinto(sub)
                while got < len(sub):
                    more = fh.readinto(sub[got:])
                    if not more:
                        raise CorruptCheckpoint(f"{path.name}: shorter than its manifest says")
                    got += more
                crc = zlib.crc32(sub, crc)
                if tick is not None:
                    tick()
            pos = hi
        if pos < end:
            skip_to(end)
        if fh.read(1):
            raise CorruptCheckpoint(f"{path.name}: longer than its manifest says")
    return crc


def file_crc(path: Path) -> tuple[int, int]:
    """(size, crc32) of a whole file."""
    crc = 0
    size = 0
    with open(path, "rb", buffering=0) as fh:
        while True:
            chunk = fh.read(CHUNK)
            if not chunk:
                break
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


# --- manifest ----------------------------------------------------------------------------------

KINDS = ("plain", "dcp", "file")
#: Checksums a manifest may name: crc32 (zlib; every disk checkpoint) or crc32c (the memory tier:
#: hardware-accelerated, ~4x faster, so a restore from memory is not held up by its verification).
CHECKSUMS = ("crc32", "crc32c")
_U32 = 1 << 32


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its size, CRC32 (None: checked by size only) and, for a plain
    checkpoint's data files, the byte range [lo, hi) of the stream it holds."""

    bytes: int
    crc32: int | None = None
    range: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bytes": self.bytes}
        if self.crc32 is not None:
            out["crc32"] = self.crc32
        if self.range is not None:
            out["range"] = list(self.range)
        return out


@dataclass(frozen=True)
class Manifest:
    """The one manifest type of every resctl checkpoint: a step directory (`kind` "plain" or
    "dcp") or an intercepted torch.save file (`kind` "file", stored as a sidecar whose `files`
    has one entry, the file's own name).

    `from_body` checks every field's type and range and the plain layout's consistency (data
    ranges cut [0, stream_bytes) end to end; every tensor inside the stream, in order, with
    nbytes = numel * element size), so a manifest that passed it cannot make a reader allocate
    more than the files hold or address bytes outside them."""

    kind: str
    step: int | None
    files: dict[str, FileEntry]
    created: float = 0.0
    world_size: int = 1
    run_id: str = ""
    stream_bytes: int = 0
    tensors: tuple[TensorSpec, ...] = ()
    checksum: str = "crc32"  # what the `crc32` fields of `files` hold (see CHECKSUMS)

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "kind": self.kind, "step": self.step,
            "created": self.created, "world_size": self.world_size,
        }
        if self.run_id:
            body["run_id"] = self.run_id
        if self.checksum != "crc32":  # absent: crc32, so disk manifests keep their exact v1 bytes
            body["checksum"] = self.checksum
        if self.kind == "file":  # the sidecar keeps its v1 shape: size and CRC at the top
            (entry,) = self.files.values()
            body.update(bytes=entry.bytes, crc32=entry.crc32)
            return body
        body["files"] = {name: e.to_json() for name, e in self.files.items()}
        if self.kind == "plain":
            body["stream_bytes"] = self.stream_bytes
            body["tensors"] = [t.to_json() for t in self.tensors]
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any], file_name: str = "") -> Manifest:
        """Parse and check a manifest body; CorruptCheckpoint says what is wrong."""
        try:
            return _parse(body, file_name)
        except CorruptCheckpoint:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise CorruptCheckpoint(f"malformed manifest: {type(err).__name__}: {err}") from None


def _int(value: Any, what: str, lo: int = 0, hi: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo or (hi is not None and value >= hi):
        raise CorruptCheckpoint(f"manifest: bad {what}: {value!r}")
    return value


def _parse(body: dict[str, Any], file_name: str) -> Manifest:
    kind = body["kind"]
    if kind not in KINDS:
        raise CorruptCheckpoint(f"manifest: unknown kind {kind!r}")
    step = None if body.get("step") is None and kind == "file" else _int(body.get("step"), "step")
    common: dict[str, Any] = dict(
        created=float(body.get("created", 0.0)), world_size=_int(body.get("world_size", 1), "world_size", 1),
        run_id=str(body.get("run_id", "")),
    )
    if body.get("checksum", "crc32") not in CHECKSUMS:
        raise CorruptCheckpoint(f"manifest: unknown checksum {body.get('checksum')!r}")
    common["checksum"] = body.get("checksum", "crc32")
    if kind == "file":
        whole = FileEntry(_int(body["bytes"], "bytes"), _int(body["crc32"], "crc32", 0, _U32))
        return Manifest(kind, step, {file_name: whole}, **common)
    files: dict[str, FileEntry] = {}
    for name, raw in dict(body["files"]).items():
        if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            raise CorruptCheckpoint(f"manifest: bad file name {name!r}")
        crc = None if raw.get("crc32") is None else _int(raw["crc32"], f"{name} crc32", 0, _U32)
        rng: tuple[int, int] | None = None
        if raw.get("range") is not None:
            lo, hi = raw["range"]
            rng = (_int(lo, f"{name} range"), _int(hi, f"{name} range"))
        files[name] = FileEntry(_int(raw["bytes"], f"{name} bytes"), crc, rng)
    if META not in files or files[META].crc32 is None:
        raise CorruptCheckpoint(f"manifest: no checksum for {META}")
    if kind == "dcp":
        return Manifest(kind, step, files, **common)
    stream = _int(body["stream_bytes"], "stream_bytes")
    tensors = tuple(TensorSpec.from_json(raw) for raw in body["tensors"])
    _check_plain_layout(files, stream, tensors)
    return Manifest(kind, step, files, stream_bytes=stream, tensors=tensors, **common)


def data_file_names(files: dict[str, FileEntry]) -> list[str]:
    """A plain checkpoint's data files, in stream order."""
    return sorted((n for n in files if n != META), key=lambda n: files[n].range or (0, 0))


def _check_plain_layout(files: dict[str, FileEntry], stream: int, tensors: tuple[TensorSpec, ...]) -> None:
    pos = 0
    for name in data_file_names(files):
        entry = files[name]
        if not re.fullmatch(r"data-\d+\.bin", name) or entry.range is None or entry.crc32 is None:
            raise CorruptCheckpoint(f"manifest: {name} is not a data file with a range and a checksum")
        lo, hi = entry.range
        if lo != pos or hi < lo or entry.bytes != hi - lo:
            raise CorruptCheckpoint(f"manifest: {name} range [{lo}, {hi}) does not continue the stream at {pos}")
        pos = hi
    if pos != stream:
        raise CorruptCheckpoint(f"manifest: data files hold {pos} bytes, stream is {stream}")
    end = 0
    for i, t in enumerate(tensors):
        _int(t.offset, f"tensor {i} offset")
        if any(d < 0 for d in t.shape):
            raise CorruptCheckpoint(f"manifest: tensor {i} has a negative dimension")
        numel = 1
        for d in t.shape:
            numel *= d
        if t.offset < end or numel * dtype_from_name(t.dtype).itemsize != t.nbytes or t.offset + t.nbytes > stream:
            raise CorruptCheckpoint(f"manifest: tensor {i} ({t.dtype} {list(t.shape)} at {t.offset}) does not fit the stream")
        end = t.offset + t.nbytes


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_manifest(path: str | os.PathLike[str], manifest: Manifest, durable: bool = True) -> None:
    """Write and fsync a manifest (the caller makes it visible by renaming its directory).
    `durable=False`: no fsync (the memory tier: its files live in tmpfs and die with the node)."""
    body = manifest.to_body()
    data = json.dumps({"crc32": zlib.crc32(_canonical(body)), "body": body}, sort_keys=True).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(path: Path, file_name: str = "") -> Manifest:
    """The checked manifest, or CorruptCheckpoint if it is missing, unparsable, fails its checksum
    or describes an impossible layout. `file_name`: the file a sidecar ("file" kind) vouches for."""
    try:
        raw = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CorruptCheckpoint("incomplete: no manifest") from None
    except (ValueError, OSError) as err:
        raise CorruptCheckpoint(f"unreadable manifest: {err}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("body"), dict):
        raise CorruptCheckpoint("malformed manifest")
    body: dict[str, Any] = raw["body"]
    if zlib.crc32(_canonical(body)) != raw.get("crc32"):
        raise CorruptCheckpoint("manifest checksum mismatch")
    if body.get("format") != FORMAT or body.get("version") != VERSION:
        raise CorruptCheckpoint(f"not a {FORMAT} v{VERSION} manifest")
    return Manifest.from_body(body, file_name)


def list_step_dirs(root: Path) -> list[tuple[int, Path]]:
    """Visible checkpoint directories as (step, path), newest first (complete or not)."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        m = STEP_DIR_RE.match(entry.name)
        if m and entry.is_dir():
            found.append((int(m.group(1)), Path(entry.path)))
    return sorted(found, reverse=True)
