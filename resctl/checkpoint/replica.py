"""Memory-tier replication: each node's newest snapshots also live in a buddy node's host memory.

With `checkpoint.memory_every > 0`, `checkpoint.memory_replicate = true` (the default) and more than
one node, `resctl run` starts a **replica server** on every node (`ReplicaServer`, a thread of the
`resctl run` process: it outlives every worker restart, dies with the node, and stops when the job
ends, after which `resctl run` removes its files with the rest of the job's memory). It listens on
`checkpoint.memory_replicate_port` (0: a free port) and tells the workers where it is in
`RESCTL_REPLICA_ADDR` (`host:port`; the host is this node's address on the route to the rendezvous
endpoint, or `RESCTL_REPLICA_HOST` when set). The server keeps what it receives in host shared
memory only (`/dev/shm/resctl-<job>/replica/rank-<R>/slot-0|1/`, double-buffered like the worker's
own slots, see `memdir`); nothing on this path touches a disk.

The **buddy** of node n is node (n+1) % N, N the number of nodes (node = torchelastic's group rank).
The workers learn each other's servers in the collective at the start of `load`; after that every
committed snapshot is offered to a `Replicator` (a background thread per rank) that sends the newest
one to the buddy's server while training goes on: the training loop never waits for the network.
A snapshot newer than the one being sent replaces any that was waiting (newest wins), and while a
slot is being sent the next local snapshot is written into the other one (`MemoryTier.save`).

`load` then looks in three places, in order: this node's memory, the buddy's copy (fetched back
into a local slot over the network and verified like any memory snapshot), the disk; all ranks
agree on one step. See docs/checkpoint.md ("Replication to a buddy node").

Authenticated (docs/security.md): each server has its own random secret, part of the address the
job's workers get (`host:port#<secret>`; never printed: `shown`), and every frame after the
server's HELLO carries a MAC keyed by it and bound to that connection's nonce (`replica_wire`),
so a stranger who reaches the port can read, drop or replace nothing and learns nothing (an
unauthenticated frame gets "not authenticated", no job name). A PUT older than the newest copy
held is refused (a resumed job first FORGETs the abandoned newer steps), so nothing can be
downgraded. The server serves at most `MAX_CONNECTIONS` connections at once (the rest are closed
at once), and the wire's deadlines bound how long any one may hold a rank's lock.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import socket
import socketserver
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from resctl import slots as slot_policy
from resctl.checkpoint import memdir
from resctl.checkpoint.replica_wire import (
    ERR,
    FORGET,
    FRAME_SECONDS,
    GET,
    LIST,
    NONCE_BYTES,
    OK,
    PUT,
    Auth,
    Deadline,
    NotAuthenticated,
    Payload,
    WireError,
    encode,
    expect_ok,
    hello,
    invalidate,
    read_frame,
    read_hello,
    receive_into_slot,
    send_payload,
    slot_payload,
)
from resctl.profile import contract

log = logging.getLogger("resctl.checkpoint.replica")

ADDR_ENV = contract.REPLICA_ADDR  # host:port of this node's replica server (set by resctl run)
HOST_ENV = contract.REPLICA_HOST  # the host to advertise instead of the one found by routing
CONNECT_TIMEOUT = 5.0
TIMEOUT = 60.0  # seconds without progress on an established transfer
MAX_RANK = 1 << 24
MAX_CONNECTIONS = 64  # at once; a node's buddy has one sender per rank, and a load asks once per rank
SECRET_BYTES = 32


def buddy(node: int, nodes: list[int]) -> int | None:
    """The node that holds `node`'s copies: the next in order, cyclically; None alone."""
    order = sorted(set(nodes))
    if node not in order or len(order) < 2:
        return None
    return order[(order.index(node) + 1) % len(order)]


def parse_addr(addr: str) -> tuple[str, int, bytes]:
    """(host, port, the server's secret) of `HOST:PORT#SECRET` (no secret: b"", refused by servers)."""
    where, _, secret = addr.partition("#")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise WireError(f"bad replica address {shown(addr)!r} (want HOST:PORT#KEY)")
    try:
        key = bytes.fromhex(secret)
    except ValueError:
        raise WireError(f"bad replica address {shown(addr)!r}: the key is not hex") from None
    return host.strip("[]"), int(port), key


def format_addr(host: str, port: int, secret: bytes = b"") -> str:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{where}#{secret.hex()}" if secret else where


def shown(addr: str) -> str:
    """An address fit for a log line, an event or a store: without its secret."""
    return addr.partition("#")[0]


def secret_of(addr: str) -> bytes:
    """The secret part of `HOST:PORT#SECRET` (b"" when none or not hex)."""
    try:
        return bytes.fromhex(addr.partition("#")[2])
    except ValueError:
        return b""


def with_secret(addr: str, secret: bytes) -> str:
    return f"{shown(addr)}#{secret.hex()}" if secret else shown(addr)


def advertised_host(endpoint: str) -> str:
    """This node's address as the other nodes reach it: `RESCTL_REPLICA_HOST`, else the local
    address of the route to the rendezvous endpoint's host (no packet is sent), else the address
    the hostname resolves to; "" when all of them are loopback addresses (other nodes would reach
    their own server there)."""
    forced = os.environ.get(HOST_ENV)
    if forced:
        return forced
    host = endpoint.rpartition(":")[0].strip("[]") if ":" in endpoint else endpoint
    try:
        family = socket.getaddrinfo(host, 1, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family[0], socket.SOCK_DGRAM) as s:
            s.connect(family[4])
            addr = str(s.getsockname()[0])
        if not ipaddress.ip_address(addr).is_loopback:
            return addr
    except (OSError, ValueError, IndexError):
        pass
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        return ""
    return "" if ipaddress.ip_address(addr).is_loopback else addr


# --- the server (one per node, in resctl run) ---------------------------------------------------


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        replica: ReplicaServer = self.server.replica  # type: ignore[attr-defined]
        replica.serve_one(self.request)


class _TCPServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, at most MAX_CONNECTIONS of them: one more is closed at once."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class ReplicaServer:
    """Keeps the buddy copies of other nodes' ranks in this node's shared memory (see the module doc)."""

    launch: str | None = None  # the memory tree's launch suffix (memdir); None: this process's env

    def __init__(self, key: str, port: int = 0, host: str = "0.0.0.0", root: Path | None = None,
                 launch: str | None = None, secret: bytes | None = None) -> None:
        self.key = key
        self.secret = secret or secrets.token_bytes(SECRET_BYTES)
        self.root = root
        self.launch = launch
        self._locks: dict[int, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._server = _TCPServer((host, port), _Handler)
        self._server.replica = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="resctl-replica-server", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def address(self, host: str) -> str:
        """What the job's workers are given: `host:port#secret` (never to be shown: `shown`)."""
        return format_addr(host, self.port, self.secret)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def slots(self, rank: int) -> list[Path]:
        base = memdir.replica_dir(self.key, rank, self.root, self.launch)
        return [base / f"slot-{k}" for k in range(slot_policy.SLOTS)]

    @contextmanager
    def _rank_lock(self, rank: int) -> Iterator[None]:
        with self._locks_lock:
            lock = self._locks.setdefault(rank, threading.Lock())
        with lock:
            yield

    def serve_one(self, conn: socket.socket) -> None:
        """One request on `conn`, answered OK or ERR (a broken connection is just closed)."""
        auth = Auth(self.secret, secrets.token_bytes(NONCE_BYTES))
        timed = Deadline(conn, FRAME_SECONDS)
        try:
            conn.sendall(hello(auth.nonce))
            op, header = read_frame(timed, auth)
            conn.settimeout(TIMEOUT)  # replies and GET data: per send, as the clients read (a PUT's data: `timed`)
            if header.get("job") != self.key:
                raise WireError("not this server's job")  # says nothing of the job it serves
            rank = header.get("rank")
            if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < MAX_RANK:
                raise WireError(f"bad rank {rank!r}")
            with self._rank_lock(rank):
                reply = self._dispatch(op, rank, header, timed, auth)
            if reply is not None:
                conn.sendall(encode(OK, reply, auth))
        except (WireError, OSError) as err:
            log.debug("replica request failed: %s", err)
            reason = "not authenticated" if isinstance(err, NotAuthenticated) else str(err)
            try:
                conn.sendall(encode(ERR, {"error": reason}, auth))
            except OSError:
                pass

    def _dispatch(self, op: int, rank: int, header: dict[str, Any], conn: Deadline,
                  auth: Auth) -> dict[str, Any] | None:
        slots = self.slots(rank)
        held = [slot_payload(s) for s in slots]
        if op == PUT:
            payload = Payload.from_header(header)
            newest = max((p.step for p in held if p is not None), default=-1)
            if payload.step < newest:  # a downgrade: a resumed job FORGETs the newer steps first
                raise WireError(f"step {payload.step} is older than the copy of step {newest} held here")
            for slot, p in zip(slots, held):
                if p is not None and p.step == payload.step:  # the same step again: replaced
                    invalidate(slot)
            kept = [p.step if p is not None and p.step < payload.step else None for p in held]
            receive_into_slot(conn, slots[slot_policy.receive_slot(kept)], payload)
            return {"step": payload.step}
        if op == LIST:
            return {"snapshots": [p.to_header() for p in held if p is not None]}
        if op == GET:
            for slot, p in zip(slots, held):
                if p is not None and p.step == header.get("step"):
                    conn.sendall(encode(OK, p.to_header(), auth))
                    send_payload(conn.conn, slot, p)  # type: ignore[arg-type]
                    return None
            raise WireError(f"no copy of rank {rank} step {header.get('step')!r} here")
        if op == FORGET:
            newer_than = header.get("newer_than")
            if not isinstance(newer_than, int):
                raise WireError("bad newer_than")
            for slot, p in zip(slots, held):
                if p is not None and p.step > newer_than:
                    invalidate(slot)
            return {}
        raise WireError(f"unknown request op {op}")


# --- the client side (workers) ------------------------------------------------------------------


@contextmanager
def _connect(addr: str, timeout: float = TIMEOUT) -> Iterator[tuple[socket.socket, Auth]]:
    """A connection to the server at `addr`, past its HELLO, with the keys of this connection."""
    host, port, secret = parse_addr(addr)
    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    try:
        sock.settimeout(timeout)
        yield sock, Auth(secret, read_hello(sock))
    finally:
        sock.close()


def put(addr: str, key: str, rank: int, slot: Path, cancel: threading.Event | None = None,
        go: threading.Event | None = None) -> Payload:
    """Send the complete snapshot in `slot` to the server at `addr` as `rank`'s; WireError/OSError
    on failure. `cancel`, `go`: see `replica_wire.send_payload`."""
    payload = slot_payload(slot)
    if payload is None:
        raise WireError(f"{slot} holds no complete snapshot")
    with _connect(addr) as (sock, auth):
        try:
            sock.sendall(encode(PUT, {"job": key, "rank": rank, **payload.to_header()}, auth))
            send_payload(sock, slot, payload, cancel, go)
        except OSError as err:  # the server refused before taking the data: its reason, if it arrived
            try:
                expect_ok(sock, auth)
            except WireError as refused:
                raise refused from err
            except OSError:
                pass
            raise
        expect_ok(sock, auth)
    return payload


def listing(addr: str, key: str, rank: int) -> list[Payload]:
    """The snapshots of `rank` the server at `addr` holds."""
    with _connect(addr) as (sock, auth):
        sock.sendall(encode(LIST, {"job": key, "rank": rank}, auth))
        snaps = expect_ok(sock, auth).get("snapshots")
    if not isinstance(snaps, list):
        raise WireError("bad replica listing")
    return [Payload.from_header(h) for h in snaps if isinstance(h, dict)]


def fetch(addr: str, key: str, rank: int, step: int, dest: Path) -> Payload:
    """Fetch `rank`'s snapshot of `step` from the server at `addr` into the slot directory `dest`
    (committed only if it arrived whole and intact)."""
    with _connect(addr) as (sock, auth):
        sock.sendall(encode(GET, {"job": key, "rank": rank, "step": step}, auth))
        payload = Payload.from_header(expect_ok(sock, auth))
        if payload.step != step:
            raise WireError(f"asked for step {step}, the replica sent step {payload.step}")
        receive_into_slot(sock, dest, payload)
    return payload


def forget(addr: str, key: str, rank: int, newer_than: int) -> None:
    """Drop `rank`'s copies newer than `newer_than` (the job resumed from there)."""
    with _connect(addr) as (sock, auth):
        sock.sendall(encode(FORGET, {"job": key, "rank": rank, "newer_than": newer_than}, auth))
        expect_ok(sock, auth)


class Replicator:
    """One rank's background sender: the newest committed snapshot goes to the buddy's server.

    `lock` guards `reading` (the slot being sent now): `MemoryTier.save` takes it to choose the slot
    to overwrite, and a send starts only on a slot whose manifest still holds the step offered, so
    a slot is never overwritten while it is read (and if it were, the receiver's checksum would
    refuse the copy)."""

    def __init__(self, addr: str, key: str, rank: int, slots: list[Path], emit: Callable[..., None]) -> None:
        self.addr, self.key, self.rank, self.slots, self.emit = addr, key, rank, slots, emit
        self.lock = threading.Lock()
        self._wake = threading.Condition(self.lock)
        self.reading: int | None = None
        self._pending: tuple[int, int] | None = None
        self._closed = False
        self._cancel = threading.Event()
        self._go = threading.Event()
        self._go.set()
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="resctl-mem-replica", daemon=True)
        self._thread.start()

    def offer(self, step: int, slot: int) -> None:
        """A snapshot was committed in `slot`: send it when the sender is free (newest wins)."""
        with self._wake:
            self._pending = (step, slot)
            self._wake.notify_all()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the transfer (between two chunks) while the block runs: a snapshot's copy gets the
        memory bandwidth to itself. Synchronous training snapshots on every node at once, so the
        buddies' receivers go quiet at the same time."""
        self._go.clear()
        try:
            yield
        finally:
            self._go.set()

    def cancel(self) -> None:
        """Stop the send in flight (between two chunks); the buddy keeps nothing of it."""
        self._cancel.set()

    def wait_idle(self, timeout: float) -> bool:
        with self._wake:
            return self._wake.wait_for(lambda: self.reading is None, timeout)

    def _next(self) -> tuple[int, int, Payload] | None:
        with self._wake:
            while True:
                self._wake.wait_for(lambda: self._pending is not None or self._closed)
                if self._closed:
                    return None
                assert self._pending is not None
                step, slot = self._pending
                self._pending = None
                payload = slot_payload(self.slots[slot])
                if payload is not None and payload.step == step:  # not overwritten since
                    self.reading = slot
                    self._cancel.clear()
                    return step, slot, payload

    def _run(self) -> None:
        while (job := self._next()) is not None:
            step, slot, payload = job
            t0 = time.monotonic()
            try:
                put(self.addr, self.key, self.rank, self.slots[slot], self._cancel, self._go)
            except (WireError, OSError) as err:
                self._failed(step, err)
            else:
                self._last_error = None
                self.emit("ckpt_replica", step=step, seconds=round(time.monotonic() - t0, 6),
                          bytes=payload.data[0], buddy=shown(self.addr))
            finally:
                with self._wake:
                    self.reading = None
                    self._wake.notify_all()

    def _failed(self, step: int, err: BaseException) -> None:
        if self._cancel.is_set():
            log.debug("replication of step %d cancelled: its slot was needed", step)
            return
        message = f"{type(err).__name__}: {err}"
        if message != self._last_error:  # once per kind of failure, not once per step
            log.warning("could not copy the memory snapshot of step %d to the buddy node %s: %s", step,
                        shown(self.addr), message)
            self.emit("ckpt_replica_fail", step=step, buddy=shown(self.addr), error=message)
        self._last_error = message

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._cancel.set()
        self._go.set()
        self._thread.join(timeout=CONNECT_TIMEOUT + 1)
