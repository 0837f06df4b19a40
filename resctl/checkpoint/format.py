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

import ctypes
import io
import json
import os
import re
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
    dtype = getattr(torch, name, None)
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
    def from_json(cls, raw: list[Any]) -> "TensorSpec":
        offset, nbytes, dtype, shape = raw
        return cls(int(offset), int(nbytes), str(dtype), tuple(int(s) for s in shape))


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
    """A writable memoryview on the bytes of a contiguous CPU tensor (no copy; keep `t` alive)."""
    n = t.numel() * t.element_size()
    if n == 0:
        return memoryview(bytearray(0))
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("byte_view needs a contiguous CPU tensor")
    return memoryview((ctypes.c_ubyte * n).from_address(t.data_ptr())).cast("B")


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


def read_range_into(
    path: Path,
    start: int,
    end: int,
    specs: list[TensorSpec],
    views: list[memoryview],
    tick: Callable[[], None] | None = None,
) -> int:
    """Read a data file holding stream bytes [start, end) into the tensors it covers; return its crc32."""
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


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def write_manifest(path: str | os.PathLike[str], body: dict[str, Any]) -> None:
    """Write and fsync a manifest (the caller makes it visible by renaming its directory)."""
    data = json.dumps({"crc32": zlib.crc32(_canonical(body)), "body": body}, sort_keys=True).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest body, or CorruptCheckpoint if it is missing, unparsable or fails its checksum."""
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
    return body


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
