"""The wire format of memory-tier replication, and the one way a snapshot lands in a slot.

A connection carries one request and its reply. Every request and reply starts with a *frame*::

    magic "RSRP" | version u8 | op u8 | n u32 | header: n bytes of JSON | crc u32

(big-endian; `crc` is the memory tier's checksum, `crc.checksum`, of everything before it), so a
damaged header is refused before any of it is used: a flipped bit can never file a snapshot under
another rank, step or job. A snapshot travels as a frame whose header carries its manifest (the
text of the slot's `manifest.json`, itself checksummed) and the size and checksum of `meta.pt`
and of `data-0.bin`, followed by those two files' bytes.

`receive_into_slot` is the only writer of a received snapshot, on the buddy (a PUT) and back on
the node that restores it (a GET): it removes the slot's manifest first, streams the data into the
preallocated file while checksumming it, checks both checksums and only then writes the manifest
(by rename). A transfer cut short, damaged or refused therefore leaves a slot without a manifest,
which nobody offers for a restore; the restoring worker verifies the slot again like any memory
snapshot (`MemoryTier.verify`) before it touches the state.

No torch here: the replica server runs in `resctl run`.
"""

from __future__ import annotations

import json
import mmap
import os
import socket
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from resctl.checkpoint import memdir
from resctl.checkpoint.crc import CHECKSUM, checksum
from resctl.checkpoint.errors import CheckpointError

MAGIC = b"RSRP"
VERSION = 1
PUT, LIST, GET, FORGET = 1, 2, 3, 4
OK, ERR = 0x80, 0x81
OPS = frozenset((PUT, LIST, GET, FORGET, OK, ERR))
MAX_HEADER = 4 << 20  # a LIST reply holds two manifests; a manifest lists every tensor of the state
CHUNK = 8 << 20  # bytes per recv_into/sendfile call (a cancel is seen between chunks)
# The slot's file names, as resctl.checkpoint.format and .memory name them (tests check they agree;
# those modules import torch, which `resctl run` does not load).
DATA, META, MANIFEST = "data-0.bin", "meta.pt", "manifest.json"
_HEAD = struct.Struct(">4sBBI")
_CRC = struct.Struct(">I")


class WireError(CheckpointError):
    """A replication transfer that was damaged, cut short or refused (nothing of it is offered)."""


class Conn(Protocol):
    """What the format needs of a connection (a socket; tests pass in-memory ones)."""

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int: ...
    def sendall(self, data: Any) -> None: ...


def encode(op: int, header: dict[str, Any]) -> bytes:
    body = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    if len(body) > MAX_HEADER:
        raise WireError(f"replica frame header too large ({len(body)} bytes)")
    head = _HEAD.pack(MAGIC, VERSION, op, len(body)) + body
    return head + _CRC.pack(checksum(head))


def read_frame(conn: Conn) -> tuple[int, dict[str, Any]]:
    """The next frame's op and header; WireError if it is not an intact frame of this version."""
    fixed = recv_exact(conn, _HEAD.size)
    magic, version, op, n = _HEAD.unpack(fixed)
    if magic != MAGIC:
        raise WireError("not a resctl replica frame")
    if version != VERSION:
        raise WireError(f"replica wire version {version}, this resctl speaks {VERSION}")
    if op not in OPS or n > MAX_HEADER:
        raise WireError(f"bad replica frame (op {op}, header {n} bytes)")
    body = recv_exact(conn, n)
    (crc,) = _CRC.unpack(recv_exact(conn, _CRC.size))
    if checksum(fixed + body) != crc:
        raise WireError("replica frame header checksum mismatch")
    try:
        header = json.loads(body)
    except ValueError as err:
        raise WireError(f"replica frame header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise WireError("replica frame header is not an object")
    return op, header


def recv_exact(conn: Conn, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:], n - got)
        if k == 0:
            raise WireError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def expect_ok(conn: Conn) -> dict[str, Any]:
    """Read a reply: its header when OK, WireError with the peer's reason when not."""
    op, header = read_frame(conn)
    if op == ERR:
        raise WireError(f"replica refused: {header.get('error', 'no reason given')}")
    if op != OK:
        raise WireError(f"unexpected replica reply (op {op})")
    return header


def _size_crc(value: Any, what: str) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)
            or value[1] >= 1 << 32):
        raise WireError(f"bad {what} entry in replica header: {value!r}")
    return value[0], value[1]


@dataclass(frozen=True)
class Payload:
    """A snapshot in transit: its manifest text and the (size, checksum) of meta.pt and data-0.bin."""

    step: int
    manifest: str
    meta: tuple[int, int]
    data: tuple[int, int]

    @classmethod
    def from_manifest(cls, text: str) -> Payload:
        """From a memory slot's manifest.json (its checksum is checked by the restoring reader)."""
        try:
            body = json.loads(text)["body"]
            files = body["files"]
            if body.get("checksum") != CHECKSUM:
                raise WireError(f"replica: the manifest's checksum is {body.get('checksum')!r}, not {CHECKSUM}")
            step, meta, data = body["step"], files[META], files[DATA]
            payload = cls(step, text, (meta["bytes"], meta["crc32"]), (data["bytes"], data["crc32"]))
        except (KeyError, TypeError, ValueError) as err:
            raise WireError(f"replica: not a memory-slot manifest ({type(err).__name__}: {err})") from None
        return cls.from_header(payload.to_header())  # one set of checks for both directions

    def to_header(self) -> dict[str, Any]:
        return {"step": self.step, "manifest": self.manifest, "meta": list(self.meta), "data": list(self.data)}

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Payload:
        step, text = header.get("step"), header.get("manifest")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0 or not isinstance(text, str):
            raise WireError("bad step or manifest in replica header")
        return cls(step, text, _size_crc(header.get("meta"), "meta"), _size_crc(header.get("data"), "data"))


def slot_payload(slot: Path) -> Payload | None:
    """The payload of a slot's complete snapshot, or None (no manifest, or not a memory slot's)."""
    try:
        text = (slot / MANIFEST).read_text()
        payload = Payload.from_manifest(text)
        if (slot / DATA).stat().st_size != payload.data[0]:
            return None
    except (OSError, UnicodeDecodeError, WireError):
        return None
    return payload


def invalidate(slot: Path) -> None:
    """Remove a slot's manifest: from now on it is incomplete and never offered."""
    try:
        os.unlink(slot / MANIFEST)
    except FileNotFoundError:
        pass


PAUSE_MAX = 5.0  # seconds a paused transfer waits for `go` before it goes on anyway


def send_payload(conn: socket.socket, slot: Path, payload: Payload, cancel: threading.Event | None = None,
                 go: threading.Event | None = None) -> None:
    """meta.pt, then data-0.bin (sendfile, in chunks: a set `cancel` stops between two, and while
    `go` is clear the next chunk waits). If the slot is overwritten meanwhile the receiver's
    checksums fail and it keeps nothing."""
    meta = (slot / META).read_bytes()
    if len(meta) != payload.meta[0]:
        raise WireError(f"replica: {slot / META} changed while being sent")
    conn.sendall(meta)
    size = payload.data[0]
    with open(slot / DATA, "rb") as fh:
        sent = 0
        while sent < size:
            if go is not None and not go.is_set():
                go.wait(PAUSE_MAX)
            if cancel is not None and cancel.is_set():
                raise WireError("replica transfer cancelled")
            n = conn.sendfile(fh, sent, min(CHUNK, size - sent))
            if n == 0:
                raise WireError(f"replica: {slot / DATA} shrank while being sent")
            sent += n


def receive_into_slot(conn: Conn, slot: Path, payload: Payload) -> None:
    """Receive a payload's bytes into `slot` and commit it (manifest last); on any failure the slot
    holds no manifest. Raises WireError (cut short, checksum mismatch) or OSError (e.g. shm full)."""
    invalidate(slot)
    slot.mkdir(parents=True, exist_ok=True)
    size, crc = payload.data
    meta = recv_exact(conn, payload.meta[0])
    got = _receive_file(conn, slot / DATA, size)
    if got != crc:
        raise WireError(f"replica: {DATA} checksum mismatch (damaged or overwritten in transit)")
    if checksum(meta) != payload.meta[1]:
        raise WireError(f"replica: {META} checksum mismatch")
    memdir.write_private(slot / META, meta)
    tmp = slot / f".{MANIFEST}.tmp"
    memdir.write_private(tmp, payload.manifest.encode())
    os.rename(tmp, slot / MANIFEST)  # the commit point


def _receive_file(conn: Conn, path: Path, size: int) -> int:
    """Stream `size` bytes into `path` (preallocated: a full tmpfs fails here, not with SIGBUS)
    through a shared mapping; return their checksum."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, 0)
            if size:
                os.posix_fallocate(fd, 0, size)
        if size == 0:
            return checksum(b"")
        # MAP_POPULATE: the page tables in one pass, not a fault per 4 KiB page as the bytes arrive.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    crc = 0
    try:
        with memoryview(mapped) as view:
            got = 0
            while got < size:
                end = min(got + CHUNK, size)
                with view[got:end] as part:
                    filled = 0
                    while filled < len(part):
                        k = conn.recv_into(part[filled:], len(part) - filled)
                        if k == 0:
                            raise WireError(f"replica: connection closed after {got + filled} of {size} data bytes")
                        filled += k
                    crc = checksum(part, crc)
                got = end
    finally:
        mapped.close()
    return crc
