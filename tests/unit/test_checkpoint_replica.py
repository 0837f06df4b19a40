"""Memory-tier replication (resctl.checkpoint.replica, replica_wire): the wire format refuses every
damaged or cut transfer, a real server on loopback keeps double-buffered copies, and a node that lost
its memory restores its snapshot from the buddy's copy bitwise.

Two "nodes" here are two shared-memory roots in one process (a lost node = an empty root); the
multi-host test (tests/integration/test_multihost.py) does it with network namespaces.
"""

from __future__ import annotations

import io
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from resctl.checkpoint import crc, memdir, memory, replica
from resctl.checkpoint import format as fmt
from resctl.checkpoint import replica_wire as wire
from resctl.checkpoint import state as st
from resctl.checkpoint.engine import Checkpointer
from resctl.telemetry.events import EventLog, read_events
from tests.unit.test_checkpoint import _assert_same, _fresh, _training
from tests.zygote import zygote

KEY = "run-r"


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "shm-a", tmp_path / "shm-b"
    a.mkdir()
    b.mkdir()
    return a, b


@pytest.fixture
def server(roots: tuple[Path, Path]) -> Iterator[replica.ReplicaServer]:
    """Node b's replica server (it holds node a's copies)."""
    srv = replica.ReplicaServer(KEY, 0, host="127.0.0.1", root=roots[1])
    yield srv
    srv.close()


def _addr(srv: replica.ReplicaServer) -> str:
    return srv.address("127.0.0.1")


def _snapshots(root: Path, steps: range, rank: int = 0, events: EventLog | None = None,
               addr: str | None = None) -> tuple[memory.MemoryTier, dict[str, Any]]:
    """A memory tier on `root` that took a snapshot of a small model+AdamW at each of `steps`."""
    c = Checkpointer(dir=root / "ck", interval_steps=10**6, memory_every=1, run_id=KEY, async_=False)
    tier = memory.MemoryTier(KEY, rank, run_id=KEY, events=events, root=root)
    tier.replicate_to(addr)
    state: dict[str, Any] = {}
    for step, state in _training(steps):
        entries, stateful = st.snapshot_entries(state)
        tensors: list[torch.Tensor] = []
        structure = st.flatten(entries, tensors, {})
        meta = st.encode_meta({"step": step, "entries": structure, "stateful": stateful})
        tier.save(tensors, meta, step, c.staging.stage)
        tier.wait()
    c.close()
    return tier, state


def _newest_slot(root: Path, rank: int = 0) -> Path:
    slots = [p for p in memdir.rank_dir(KEY, rank, root).glob("slot-*") if (p / fmt.MANIFEST).exists()]
    return max(slots, key=lambda p: fmt.read_manifest(p / fmt.MANIFEST).step or 0)


def test_the_wire_names_the_files_and_checksum_as_the_memory_tier_does() -> None:
    assert (wire.DATA, wire.META, wire.MANIFEST) == (memory.DATA, fmt.META, fmt.MANIFEST)
    assert crc.CHECKSUM == memory.CHECKSUM == "crc32c"


def test_buddy_is_the_next_node_cyclically() -> None:
    assert replica.buddy(0, [0, 0, 1, 1]) == 1 and replica.buddy(1, [1, 0]) == 0
    assert replica.buddy(2, [0, 1, 2]) == 0 and replica.buddy(0, [0, 0]) is None


# --- the wire format: damaged and cut transfers never commit --------------------------------------


class _Conn:
    """A connection that plays `make(auth)` to the server (the request, built once the server's
    HELLO gave this connection's nonce; `data` when given as bytes) and records what is sent back."""

    def __init__(self, data: bytes | Callable[[wire.Auth], bytes]) -> None:
        self._make = data if callable(data) else None
        self._in = io.BytesIO(b"" if callable(data) else data)
        self.sent = bytearray()

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        chunk = self._in.read(min(nbytes or len(buffer), 1 << 16))
        buffer[: len(chunk)] = chunk
        return len(chunk)

    def sendall(self, data: Any) -> None:
        if self._make is not None and not self.sent:  # the HELLO: now the request can be made
            nonce = wire.read_hello(_Conn(bytes(data)))
            self._in = io.BytesIO(self._make(wire.Auth(SECRET, nonce)))
        self.sent += bytes(data)

    def settimeout(self, _t: float) -> None:
        pass


SECRET = b"k" * 32


def _reply(conn: _Conn) -> tuple[int, dict[str, Any]]:
    """The server's reply (after its HELLO) on a recorded connection."""
    c = _Conn(bytes(conn.sent))
    return wire.read_frame(c, wire.Auth(SECRET, wire.read_hello(c)))


@pytest.fixture(scope="module")
def put_parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], bytes]:
    """What a PUT of a real snapshot sends: its header, then meta.pt and data-0.bin."""
    root = tmp_path_factory.mktemp("wire")
    tier, _ = _snapshots(root, range(1, 3))
    tier.close()
    slot = _newest_slot(root)
    payload = wire.slot_payload(slot)
    assert payload is not None and payload.step == 2
    return {"job": KEY, "rank": 0, **payload.to_header()}, (slot / wire.META).read_bytes() + (slot / wire.DATA).read_bytes()


def _put(parts: tuple[dict[str, Any], bytes], change: Callable[[bytes], bytes] = lambda b: b
         ) -> Callable[[wire.Auth], bytes]:
    return lambda auth: change(wire.encode(wire.PUT, parts[0], auth) + parts[1])


def _serve(stream: bytes | Callable[[wire.Auth], bytes], root: Path) -> tuple[replica.ReplicaServer, _Conn]:
    srv = replica.ReplicaServer.__new__(replica.ReplicaServer)  # the request logic, without a socket
    srv.key, srv.root, srv._locks, srv.secret = KEY, root, {}, SECRET
    srv._locks_lock = threading.Lock()
    conn = _Conn(stream)
    srv.serve_one(conn)  # type: ignore[arg-type]
    return srv, conn


def _committed(root: Path) -> list[wire.Payload]:
    return [p for s in (memdir.replica_dir(KEY, 0, root) / f"slot-{k}" for k in range(memdir.SLOTS))
            if (p := wire.slot_payload(s)) is not None]


def test_an_intact_put_commits_a_byte_identical_copy(put_parts: tuple[dict[str, Any], bytes], tmp_path: Path) -> None:
    _, conn = _serve(_put(put_parts), tmp_path)
    (held,) = _committed(tmp_path)
    assert held.step == 2
    op, reply = _reply(conn)
    assert op == wire.OK and reply == {"step": 2}
    slot = memdir.replica_dir(KEY, 0, tmp_path) / "slot-0"
    assert put_parts[1] == (slot / wire.META).read_bytes() + (slot / wire.DATA).read_bytes()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=hs.floats(0, 1, exclude_max=True))
def test_a_transfer_cut_anywhere_commits_nothing_and_keeps_nothing(
        put_parts: tuple[dict[str, Any], bytes], tmp_path_factory: pytest.TempPathFactory, cut: float) -> None:
    root = tmp_path_factory.mktemp("cut")
    _, conn = _serve(_put(put_parts, lambda b: b[: int(cut * len(b))]), root)
    assert _committed(root) == []
    assert _reply(conn)[0] == wire.ERR
    assert not list(root.rglob(wire.DATA)), "a failed transfer gives back what it took"


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(where=hs.floats(0, 1, exclude_max=True), bit=hs.integers(0, 7))
def test_a_flipped_bit_anywhere_commits_nothing(put_parts: tuple[dict[str, Any], bytes],
                                                tmp_path_factory: pytest.TempPathFactory, where: float, bit: int) -> None:
    root = tmp_path_factory.mktemp("flip")

    def flip(b: bytes) -> bytes:
        damaged = bytearray(b)
        damaged[int(where * len(damaged))] ^= 1 << bit
        return bytes(damaged)

    _serve(_put(put_parts, flip), root)
    assert _committed(root) == []


@given(header=hs.dictionaries(hs.text(max_size=8), hs.integers() | hs.text(max_size=20), max_size=5),
       op=hs.sampled_from(sorted(wire.OPS)))
def test_frames_round_trip_and_any_prefix_is_refused(header: dict[str, Any], op: int) -> None:
    auth = wire.Auth(SECRET, b"n" * wire.NONCE_BYTES)
    frame = wire.encode(op, header, auth)
    assert wire.read_frame(_Conn(frame), auth) == (op, header)
    for n in range(len(frame)):
        with pytest.raises(wire.WireError):
            wire.read_frame(_Conn(frame[:n]), auth)


def test_a_frame_of_another_job_or_a_bad_rank_is_refused(tmp_path: Path) -> None:
    for header in ({"job": "other", "rank": 0}, {"job": KEY, "rank": -1}, {"job": KEY, "rank": True}):
        _, conn = _serve(lambda auth, h=header: wire.encode(wire.LIST, h, auth), tmp_path)
        op, reply = _reply(conn)
        assert op == wire.ERR and reply["error"] and KEY not in reply["error"]


# --- a real server on loopback ---------------------------------------------------------------------


def _wait_replicated(ev: Path, step: int, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if any(e["kind"] == "ckpt_replica" and e["step"] == step for e in read_events(ev)):
            return
        time.sleep(0.02)
    raise AssertionError(f"step {step} was not replicated: {read_events(ev)}")


def test_snapshots_reach_the_buddy_and_a_node_that_lost_its_memory_restores_from_there(
        roots: tuple[Path, Path], server: replica.ReplicaServer, tmp_path: Path) -> None:
    a, _ = roots
    ev = tmp_path / "ev"
    tier, saved = _snapshots(a, range(1, 6), events=EventLog(ev, rank=0), addr=_addr(server))
    _wait_replicated(ev, 5)
    tier.close()
    held = sorted(p.step for p in replica.listing(_addr(server), KEY, 0))
    assert held[-1] == 5 and len(held) == 2  # double-buffered: the newest and one before
    # Node a is lost: its memory is gone. A new tier on an empty root finds step 5 at the buddy.
    lost = tmp_path / "shm-a-again"
    lost.mkdir()
    again = memory.MemoryTier(KEY, 0, run_id=KEY, root=lost)
    again.replicate_to(_addr(server))
    assert again.steps(1) == {} and 5 in again.buddy_steps(1)
    state = _fresh()
    verified = again.verify(5, again.fetch(5), state)
    again.restore(verified, state)
    _assert_same(state["model"].state_dict(), saved["model"].state_dict())
    _assert_same(state["optim"].state_dict(), saved["optim"].state_dict())
    assert state["extra"] == {"note": "x", "step": 5}
    # Resumed at 5 after a damaged 6 (say): the buddy drops anything newer, as the node does.
    again.forget_newer(4)
    assert all(p.step <= 4 for p in replica.listing(_addr(server), KEY, 0))
    again.close()


def test_an_older_step_is_refused_until_the_abandoned_newer_one_is_forgotten(roots: tuple[Path, Path],
                                                                              server: replica.ReplicaServer) -> None:
    """A downgrade (a replayed or stray old PUT) never drops newer copies; a job that resumed from
    an older step FORGETs the abandoned ones first (MemoryTier.forget_newer), then sends again."""
    a, b = roots
    tier, _ = _snapshots(a, range(1, 4))
    tier.close()
    slots = sorted(memdir.rank_dir(KEY, 0, a).glob("slot-*"), key=lambda p: fmt.read_manifest(p / fmt.MANIFEST).step or 0)
    replica.put(_addr(server), KEY, 0, slots[1])  # step 3
    with pytest.raises(wire.WireError, match="older than the copy of step 3"):
        replica.put(_addr(server), KEY, 0, slots[0])  # step 2
    assert sorted(p.step for p in replica.listing(_addr(server), KEY, 0)) == [3]
    replica.forget(_addr(server), KEY, 0, newer_than=1)  # the job resumed from 1 and is at 2 again
    replica.put(_addr(server), KEY, 0, slots[0])
    assert sorted(p.step for p in replica.listing(_addr(server), KEY, 0)) == [2]


def test_a_damaged_copy_at_the_buddy_is_refused_on_fetch(roots: tuple[Path, Path], server: replica.ReplicaServer,
                                                         tmp_path: Path) -> None:
    a, b = roots
    tier, _ = _snapshots(a, range(1, 2))
    tier.close()
    replica.put(_addr(server), KEY, 0, _newest_slot(a))
    (slot,) = [s for s in memdir.replica_dir(KEY, 0, b).glob("slot-*") if (s / fmt.MANIFEST).exists()]
    with open(slot / wire.DATA, "r+b") as fh:  # memory corruption on the buddy
        fh.seek(7)
        byte = fh.read(1)
        fh.seek(7)
        fh.write(bytes([byte[0] ^ 1]))
    dest = tmp_path / "dest"
    with pytest.raises(wire.WireError, match="checksum mismatch"):
        replica.fetch(_addr(server), KEY, 0, 1, dest)
    assert not (dest / fmt.MANIFEST).exists()


def test_replication_never_stalls_snapshots_when_the_buddy_is_unreachable(roots: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    """A buddy address nobody listens on: every snapshot still commits locally, one failure event."""
    ev = tmp_path / "ev"
    tier, _ = _snapshots(roots[0], range(1, 6), events=EventLog(ev, rank=0), addr="127.0.0.1:9")
    tier.close()
    kinds = [e["kind"] for e in read_events(ev)]
    assert kinds.count("ckpt_mem") == 5 and kinds.count("ckpt_replica_fail") == 1, kinds


# --- two real ranks on two "nodes": Checkpointer.load agrees on the buddy's copy ------------------

WORKER = '''
import os, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
import torch.distributed as dist
from resctl.checkpoint import replica
from resctl.checkpoint.engine import Checkpointer
from resctl.telemetry.events import EventLog

tmp, phase = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)  # each rank its own state: rank 1 must get its own copy back
model = torch.nn.Linear(16, 8)
optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
state = {"model": model, "optim": optim, "extra": None}
ck = Checkpointer(dir=tmp + "/ck", interval_steps=10**6, memory_every=1, memory_replicate=True,
                  events=EventLog(tmp + "/ev", rank=rank))
start = ck.load(state)
if phase == "save":
    for step in range(1, 5):
        model(torch.randn(4, 16)).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()
        state["extra"] = {"step": step, "rank": rank}
        ck.maybe_save(state, step)
        torch.save({"model": model.state_dict(), "optim": optim.state_dict()}, f"{tmp}/rank{rank}-{step}.pt")
        ck.wait()
        rep = ck.memory_tier().replicator
        # Each snapshot reaches the buddy before the next step (no compute between steps here: a
        # transfer still running would make the next snapshots overwrite the newest slot instead).
        for _ in range(400):
            if step in {p.step for p in replica.listing(rep.addr, rep.key, rank)}:
                break
            time.sleep(0.025)
else:
    want = torch.load(f"{tmp}/rank{rank}-{start}.pt", weights_only=True)
    def same(a, b):
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b
    assert same(want["model"], model.state_dict()) and same(want["optim"], optim.state_dict())
    print("loaded", start, state["extra"], flush=True)
dist.barrier()
print("ok", rank, flush=True)
os._exit(0)  # no clean end: the memory stays, as for a killed worker
'''


def _run_ranks(script: Path, tmp: Path, phase: str, servers: list[replica.ReplicaServer], roots: list[Path]) -> list[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repo = Path(__file__).resolve().parents[2]
    procs = []
    for rank in range(2):  # one rank per node: node = rank
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0",
                   GROUP_RANK=str(rank), GROUP_WORLD_SIZE="2", TORCHELASTIC_RUN_ID=KEY, OMP_NUM_THREADS="1",
                   RESCTL_SHM_DIR=str(roots[rank]), RESCTL_REPLICA_ADDR=_addr(servers[rank]),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH", "")])))
        procs.append(zygote().popen([sys.executable, str(script), str(tmp), phase], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(f"--- rank {r} ---\n{o[-3000:]}" for r, o in enumerate(outs))
    return outs


@pytest.mark.slow
@pytest.mark.nvrx_independent  # no launcher: two processes and the replica wire
def test_a_rank_whose_node_lost_its_memory_restores_from_the_buddy_and_all_agree(tmp_path: Path) -> None:
    """Node 1 loses its memory (its root wiped, its server's copies too); node 0's copy of rank 1's
    step 4 is damaged. Every rank agrees on step 3: rank 1 from node 0's copy (tier buddy), rank 0
    from its own memory, each its own state bitwise. (The intact case: the multi-host test.)"""
    damage = True
    roots = [tmp_path / "shm-0", tmp_path / "shm-1"]
    for r in roots:
        r.mkdir()
    servers = [replica.ReplicaServer(KEY, 0, host="127.0.0.1", root=r) for r in roots]
    try:
        script = tmp_path / "worker.py"
        script.write_text(WORKER)
        _run_ranks(script, tmp_path, "save", servers, roots)
        assert sorted(p.step for p in replica.listing(_addr(servers[0]), KEY, 1)) == [3, 4]
        for p in roots[1].iterdir():  # node 1 lost: its own snapshots and the copies it kept
            shutil.rmtree(p)
        if damage:
            slot = next(s for s in memdir.replica_dir(KEY, 1, roots[0]).glob("slot-*")
                        if (p := wire.slot_payload(s)) is not None and p.step == 4)
            with open(slot / wire.DATA, "r+b") as fh:
                fh.seek(3)
                b = fh.read(1)
                fh.seek(3)
                fh.write(bytes([b[0] ^ 0x80]))
        outs = _run_ranks(script, tmp_path, "load", servers, roots)
    finally:
        for s in servers:
            s.close()
    want = 3 if damage else 4
    assert all(f"loaded {want} {{'step': {want}, 'rank': {r}}}" in out for r, out in enumerate(outs)), outs
    loads = {e["rank"]: e for e in read_events(tmp_path / "ev") if e["kind"] == "ckpt_load"}
    assert (loads[0]["tier"], loads[1]["tier"]) == ("memory", "buddy") and loads[0]["step"] == loads[1]["step"] == want
    if damage:
        skips = [e for e in read_events(tmp_path / "ev") if e["kind"] == "ckpt_skip"]
        assert {e["step"] for e in skips} == {4} and any("checksum mismatch" in e["reason"] for e in skips), skips


def test_a_full_shm_on_the_buddy_refuses_the_copy_and_the_sender_says_so_once(roots: tuple[Path, Path],
                                                                              tmp_path: Path) -> None:
    """The buddy's tmpfs has no room (a real 8 KiB tmpfs): the PUT is refused with the reason, nothing
    is committed there, and the sender reports one `ckpt_replica_fail` while snapshots go on."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a small tmpfs")
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(tiny)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        srv = replica.ReplicaServer(KEY, 0, host="127.0.0.1", root=tiny)
        try:
            ev = tmp_path / "ev"
            tier, _ = _snapshots(roots[0], range(1, 4), events=EventLog(ev, rank=0), addr=_addr(srv))
            with pytest.raises(wire.WireError, match="no room for"):  # refused before anything is allocated
                replica.put(_addr(srv), KEY, 0, _newest_slot(roots[0]))
            # The sender's thread may not have tried yet on a loaded box; a close would drop its offer.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not any(e["kind"] == "ckpt_replica_fail" for e in read_events(ev)):
                time.sleep(0.05)
            tier.close()
            assert _committed(tiny) == []
            kinds = [e["kind"] for e in read_events(ev)]
            assert kinds.count("ckpt_mem") == 3 and kinds.count("ckpt_replica_fail") == 1, kinds
        finally:
            srv.close()
    finally:
        subprocess.run(["umount", "-l", str(tiny)], check=False)
