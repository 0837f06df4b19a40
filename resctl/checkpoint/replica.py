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

Not authenticated (like torch.distributed's TCPStore): the server accepts only frames whose job key
is this job's, and everything it hands back is verified by the restoring worker before use.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import socketserver
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from resctl.checkpoint import memdir
from resctl.checkpoint import slots as slot_policy
from resctl.checkpoint.replica_wire import (
    ERR,
    FORGET,
    GET,
    LIST,
    OK,
    PUT,
    Payload,
    WireError,
    encode,
    expect_ok,
    invalidate,
    read_frame,
    receive_into_slot,
    send_payload,
    slot_payload,
)

log = logging.getLogger("resctl.checkpoint.replica")

ADDR_ENV = "RESCTL_REPLICA_ADDR"  # host:port of this node's replica server (set by resctl run)
HOST_ENV = "RESCTL_REPLICA_HOST"  # the host to advertise instead of the one found by routing
CONNECT_TIMEOUT = 5.0
TIMEOUT = 60.0  # seconds without progress on an established transfer
MAX_RANK = 1 << 24


def buddy(node: int, nodes: list[int]) -> int | None:
    """The node that holds `node`'s copies: the next in order, cyclically; None alone."""
    order = sorted(set(nodes))
    if node not in order or len(order) < 2:
        return None
    return order[(order.index(node) + 1) % len(order)]


def parse_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise WireError(f"bad replica address {addr!r} (want HOST:PORT)")
    return host.strip("[]"), int(port)


def format_addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


class ReplicaServer:
    """Keeps the buddy copies of other nodes' ranks in this node's shared memory (see the module doc)."""

    def __init__(self, key: str, port: int = 0, host: str = "0.0.0.0", root: Path | None = None) -> None:
        self.key = key
        self.root = root
        self._locks: dict[int, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._server = _TCPServer((host, port), _Handler)
        self._server.replica = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="resctl-replica-server", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def slots(self, rank: int) -> list[Path]:
        base = memdir.replica_dir(self.key, rank, self.root)
        return [base / f"slot-{k}" for k in range(slot_policy.SLOTS)]

    @contextmanager
    def _rank_lock(self, rank: int) -> Iterator[None]:
        with self._locks_lock:
            lock = self._locks.setdefault(rank, threading.Lock())
        with lock:
            yield

    def serve_one(self, conn: socket.socket) -> None:
        """One request on `conn`, answered OK or ERR (a broken connection is just closed)."""
        conn.settimeout(TIMEOUT)
        try:
            op, header = read_frame(conn)
            if header.get("job") != self.key:
                raise WireError(f"job {header.get('job')!r} is not this server's job ({self.key})")
            rank = header.get("rank")
            if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < MAX_RANK:
                raise WireError(f"bad rank {rank!r}")
            with self._rank_lock(rank):
                reply = self._dispatch(op, rank, header, conn)
            if reply is not None:
                conn.sendall(encode(OK, reply))
        except (WireError, OSError) as err:
            log.debug("replica request failed: %s", err)
            try:
                conn.sendall(encode(ERR, {"error": str(err)}))
            except OSError:
                pass

    def _dispatch(self, op: int, rank: int, header: dict[str, Any], conn: socket.socket) -> dict[str, Any] | None:
        slots = self.slots(rank)
        held = [slot_payload(s) for s in slots]
        if op == PUT:
            payload = Payload.from_header(header)
            for slot, p in zip(slots, held):
                if p is not None and p.step >= payload.step:  # a resumed job's abandoned timeline
                    invalidate(slot)
            kept = [p.step if p is not None and p.step < payload.step else None for p in held]
            receive_into_slot(conn, slots[slot_policy.receive_slot(kept)], payload)
            return {"step": payload.step}
        if op == LIST:
            return {"snapshots": [p.to_header() for p in held if p is not None]}
        if op == GET:
            for slot, p in zip(slots, held):
                if p is not None and p.step == header.get("step"):
                    conn.sendall(encode(OK, p.to_header()))
                    send_payload(conn, slot, p)
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
def _connect(addr: str, timeout: float = TIMEOUT) -> Iterator[socket.socket]:
    sock = socket.create_connection(parse_addr(addr), timeout=CONNECT_TIMEOUT)
    try:
        sock.settimeout(timeout)
        yield sock
    finally:
        sock.close()


def put(addr: str, key: str, rank: int, slot: Path, cancel: threading.Event | None = None,
        go: threading.Event | None = None) -> Payload:
    """Send the complete snapshot in `slot` to the server at `addr` as `rank`'s; WireError/OSError
    on failure. `cancel`, `go`: see `replica_wire.send_payload`."""
    payload = slot_payload(slot)
    if payload is None:
        raise WireError(f"{slot} holds no complete snapshot")
    with _connect(addr) as sock:
        sock.sendall(encode(PUT, {"job": key, "rank": rank, **payload.to_header()}))
        send_payload(sock, slot, payload, cancel, go)
        expect_ok(sock)
    return payload


def listing(addr: str, key: str, rank: int) -> list[Payload]:
    """The snapshots of `rank` the server at `addr` holds."""
    with _connect(addr) as sock:
        sock.sendall(encode(LIST, {"job": key, "rank": rank}))
        snaps = expect_ok(sock).get("snapshots")
    if not isinstance(snaps, list):
        raise WireError("bad replica listing")
    return [Payload.from_header(h) for h in snaps if isinstance(h, dict)]


def fetch(addr: str, key: str, rank: int, step: int, dest: Path) -> Payload:
    """Fetch `rank`'s snapshot of `step` from the server at `addr` into the slot directory `dest`
    (committed only if it arrived whole and intact)."""
    with _connect(addr) as sock:
        sock.sendall(encode(GET, {"job": key, "rank": rank, "step": step}))
        payload = Payload.from_header(expect_ok(sock))
        if payload.step != step:
            raise WireError(f"asked for step {step}, the replica sent step {payload.step}")
        receive_into_slot(sock, dest, payload)
    return payload


def forget(addr: str, key: str, rank: int, newer_than: int) -> None:
    """Drop `rank`'s copies newer than `newer_than` (the job resumed from there)."""
    with _connect(addr) as sock:
        sock.sendall(encode(FORGET, {"job": key, "rank": rank, "newer_than": newer_than}))
        expect_ok(sock)


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
                          bytes=payload.data[0], buddy=self.addr)
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
            log.warning("could not copy the memory snapshot of step %d to the buddy node %s: %s", step, self.addr,
                        message)
            self.emit("ckpt_replica_fail", step=step, buddy=self.addr, error=message)
        self._last_error = message

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        self._cancel.set()
        self._go.set()
        self._thread.join(timeout=CONNECT_TIMEOUT + 1)
