"""The wire format of memory-tier replication, and the one way a snapshot lands in a slot.

A connection carries one request and its reply. The server opens it with a HELLO frame carrying
a fresh random *nonce*; every frame after that is authenticated with the server's secret (32
random bytes made by `resctl run`, handed to the job's own workers in `RESCTL_REPLICA_ADDR` and
the all-gather of addresses at `load`)::

    magic "RSRP" | version u8 | op u8 | n u32 | tag: 16 bytes | header: n bytes of JSON | mac: 32 bytes

(big-endian). `tag` = HMAC-SHA256(secret, nonce "T" fixed part)[:16] is checked before a byte of the
header is read, so a stranger makes the server read 26 bytes and allocate nothing; `mac` =
HMAC-SHA256(secret, nonce "M" fixed part header) covers the whole frame, so no header is used that
the job did not write, and none can be replayed on another connection (another nonce). A damaged
header is refused the same way: a flipped bit can never file a snapshot under another rank, step or
job. A snapshot travels as a frame whose header carries its manifest (the text of the slot's
`manifest.json`, itself checksummed) and the size and checksum of `meta.pt` and of `data-0.bin`,
followed by those two files' bytes (checked against the authenticated checksums; they protect
against damage, not against a man in the middle of the job's network).

Bounds (a peer, or a stranger, cannot make the server hold more than this): a frame's header must
arrive within `FRAME_SECONDS`, data at `MIN_RATE` or faster (a one-byte-a-second sender is cut off);
memory is taken as data arrives (the header buffer grows with what was received, the slot file is
allocated chunk by chunk); a claim larger than the free shared memory is refused before anything is
allocated; a transfer that fails leaves no data file behind; a header nested too deep is refused.

`receive_into_slot` is the only writer of a received snapshot, on the buddy (a PUT) and back on
the node that restores it (a GET): it removes the slot's manifest first, streams the data into the
preallocated file while checksumming it, checks both checksums and only then writes the manifest
(by rename). A transfer cut short, damaged or refused therefore leaves a slot without a manifest,
which nobody offers for a restore; the restoring worker verifies the slot again like any memory
snapshot (`MemoryTier.verify`) before it touches the state.

No torch here: the replica server runs in `resctl run`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import mmap
import os
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from resctl.checkpoint import memdir
from resctl.checkpoint.crc import CHECKSUM, checksum
from resctl.checkpoint.errors import CheckpointError

MAGIC = b"RSRP"
VERSION = 2
PUT, LIST, GET, FORGET, HELLO = 1, 2, 3, 4, 5
OK, ERR = 0x80, 0x81
OPS = frozenset((PUT, LIST, GET, FORGET, HELLO, OK, ERR))
MAX_HEADER = 4 << 20  # a LIST reply holds two manifests; a manifest lists every tensor of the state
CHUNK = 8 << 20  # bytes per recv_into/sendfile call (a cancel is seen between chunks)
RECV_STEP = 64 << 10  # a header buffer grows by at most this much per read
FRAME_SECONDS = 10.0  # a whole frame header must arrive within this
MIN_RATE = 1 << 20  # bytes/s below which a transfer of snapshot data is cut off
NONCE_BYTES, TAG_BYTES, MAC_BYTES = 16, 16, 32
# The slot's file names, as resctl.checkpoint.format and .memory name them (tests check they agree;
# those modules import torch, which `resctl run` does not load).
DATA, META, MANIFEST = "data-0.bin", "meta.pt", "manifest.json"
_HEAD = struct.Struct(">4sBBI")


class WireError(CheckpointError):
    """A replication transfer that was damaged, cut short or refused (nothing of it is offered)."""


class NotAuthenticated(WireError):
    """A frame without this job's secret (a stranger, a stale key, or damage)."""


class Conn(Protocol):
    """What the format needs of a connection (a socket; tests pass in-memory ones)."""

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int: ...
    def sendall(self, data: Any) -> None: ...


@dataclass(frozen=True)
class Auth:
    """One connection's keys: the server's secret and the nonce of its HELLO."""

    secret: bytes
    nonce: bytes

    def tag(self, fixed: bytes) -> bytes:
        return hmac.new(self.secret, self.nonce + b"T" + fixed, hashlib.sha256).digest()[:TAG_BYTES]

    def mac(self, fixed: bytes, body: bytes) -> bytes:
        return hmac.new(self.secret, self.nonce + b"M" + fixed + body, hashlib.sha256).digest()


OPEN = Auth(b"", b"")  # the HELLO frame: its nonce is public (checksummed, not secret)


class Deadline:
    """A connection whose reads must be done by `at` (time.monotonic()); a slow peer is cut off."""

    def __init__(self, conn: Conn, seconds: float) -> None:
        self.conn, self.at = conn, time.monotonic() + seconds

    def extend(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        left = self.at - time.monotonic()
        if left <= 0:
            raise WireError("replica peer too slow: deadline passed")
        settimeout = getattr(self.conn, "settimeout", None)
        if settimeout is not None:
            settimeout(left)
        try:
            return self.conn.recv_into(buffer, nbytes)
        except TimeoutError:
            raise WireError("replica peer too slow: deadline passed") from None

    def sendall(self, data: Any) -> None:
        self.conn.sendall(data)


def encode(op: int, header: dict[str, Any], auth: Auth) -> bytes:
    body = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    if len(body) > MAX_HEADER:
        raise WireError(f"replica frame header too large ({len(body)} bytes)")
    fixed = _HEAD.pack(MAGIC, VERSION, op, len(body))
    return fixed + auth.tag(fixed) + body + auth.mac(fixed, body)


def hello(nonce: bytes) -> bytes:
    return encode(HELLO, {"nonce": nonce.hex()}, OPEN)


def read_hello(conn: Conn) -> bytes:
    """The nonce of the server's HELLO (the first frame of every connection)."""
    op, header = read_frame(conn, OPEN)
    nonce = header.get("nonce") if op == HELLO else None
    try:
        value = bytes.fromhex(nonce) if isinstance(nonce, str) else b""
    except ValueError:
        value = b""
    if len(value) != NONCE_BYTES:
        raise WireError("not a resctl replica server (no HELLO)")
    return value


def read_frame(conn: Conn, auth: Auth) -> tuple[int, dict[str, Any]]:
    """The next frame's op and header; NotAuthenticated if it is not this job's (nothing of its
    header is read then), WireError if it is not an intact frame of this version."""
    fixed = recv_exact(conn, _HEAD.size)
    magic, version, op, n = _HEAD.unpack(fixed)
    if magic != MAGIC:
        raise WireError("not a resctl replica frame")
    if version != VERSION:
        raise WireError(f"replica wire version {version}, this resctl speaks {VERSION}")
    if not hmac.compare_digest(recv_exact(conn, TAG_BYTES), auth.tag(fixed)):
        raise NotAuthenticated("replica frame not authenticated")
    if op not in OPS or n > MAX_HEADER:
        raise WireError(f"bad replica frame (op {op}, header {n} bytes)")
    body = recv_exact(conn, n)
    if not hmac.compare_digest(recv_exact(conn, MAC_BYTES), auth.mac(fixed, body)):
        raise NotAuthenticated("replica frame not authenticated (damaged or forged)")
    try:
        header = json.loads(body)
    except (ValueError, RecursionError) as err:
        raise WireError(f"replica frame header is not plain JSON: {type(err).__name__}") from None
    if not isinstance(header, dict):
        raise WireError("replica frame header is not an object")
    return op, header


def recv_exact(conn: Conn, n: int) -> bytes:
    """`n` bytes; the buffer grows with what arrives (a claimed size costs nothing until it is sent)."""
    buf = bytearray()
    while len(buf) < n:
        want = min(n - len(buf), RECV_STEP)
        part = bytearray(want)
        k = conn.recv_into(part, want)
        if k == 0:
            raise WireError(f"connection closed after {len(buf)} of {n} bytes")
        buf += part[:k]
    return bytes(buf)


def expect_ok(conn: Conn, auth: Auth) -> dict[str, Any]:
    """Read a reply: its header when OK, WireError with the peer's reason when not."""
    op, header = read_frame(conn, auth)
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
    holds no manifest and no data file (nothing stays pinned). Raises WireError (cut short, too
    slow, checksum mismatch) or OSError (e.g. shm full)."""
    invalidate(slot)
    memdir.ensure_private(slot)
    size, crc = payload.data
    free = _free_bytes(slot)
    if free is not None and size + payload.meta[0] > free + _allocated(slot / DATA, size):
        raise WireError(f"replica: no room for {size + payload.meta[0]} bytes in {slot.parent} ({free} free)")
    if isinstance(conn, Deadline):  # the data may take its time, at MIN_RATE at least
        conn.extend(FRAME_SECONDS + (size + payload.meta[0]) / MIN_RATE)
    try:
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
    except BaseException:
        for name in (DATA, META, f".{MANIFEST}.tmp"):  # give back what the failed transfer took
            try:
                os.unlink(slot / name)
            except OSError:
                pass
        raise


def _free_bytes(slot: Path) -> int | None:
    try:
        st = os.statvfs(slot)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _allocated(path: Path, size: int) -> int:
    """Bytes of `path` that a receive of `size` bytes reuses (a slot keeps its file between copies)."""
    try:
        info = os.lstat(path)
    except OSError:
        return 0
    return min(info.st_blocks * 512, size) if info.st_size == size else 0


def _receive_file(conn: Conn, path: Path, size: int) -> int:
    """Stream `size` bytes into `path` through a shared mapping, one chunk at a time, each allocated
    just before its bytes are read (a full tmpfs fails here, not with SIGBUS; a claim that is never
    sent costs nothing); return their checksum."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    crc = 0
    try:
        if os.fstat(fd).st_size != size:
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)  # sparse: no memory yet
        if size == 0:
            return checksum(b"")
        got = 0
        # MAP_POPULATE: the page tables in one pass, not a fault per 4 KiB page as the bytes arrive.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        while got < size:
            length = min(CHUNK, size - got)
            os.posix_fallocate(fd, got, length)
            mapped = mmap.mmap(fd, length, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=got)
            try:
                with memoryview(mapped) as part:
                    filled = 0
                    while filled < length:
                        k = conn.recv_into(part[filled:], length - filled)
                        if k == 0:
                            raise WireError(f"replica: connection closed after {got + filled} of {size} data bytes")
                        filled += k
                    crc = checksum(part, crc)
            finally:
                mapped.close()
            got += length
    finally:
        os.close(fd)
    return crc
