"""resctl's rendezvous handler (resctl.launch.owned_rdzv) on a real TCPStore, one handler per
simulated node in threads: rounds, a lost node with and without a replacement, spares, closing,
and what the launcher reads (num_nodes_waiting, num_nodes). The multi-process runs under the real
ft_launcher are tests/integration/test_owned_rdzv.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

dist = pytest.importorskip("torch.distributed")
from resctl.launch.owned_rdzv import OwnedRendezvousHandler, _Errors, _Settings, mark_dead, mark_launcher_gone  # noqa: E402

KEEP_ALIVE, MISSES = 0.2, 3


@pytest.fixture
def port() -> Iterator[int]:
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), use_libuv=False)
    yield server.port


class Cluster:
    def __init__(self, port: int, run_id: str, min_nodes: int, max_nodes: int, last_call: float = 30.0) -> None:
        self.port, self.args = port, (run_id, min_nodes, max_nodes, 30.0, last_call, KEEP_ALIVE, MISSES, True)
        self.handlers: list[OwnedRendezvousHandler] = []

    def node(self, kind: type[OwnedRendezvousHandler] = OwnedRendezvousHandler) -> Any:
        client = dist.TCPStore("127.0.0.1", self.port, None, False, timeout=timedelta(seconds=30), use_libuv=False)
        beat = dist.TCPStore("127.0.0.1", self.port, None, False, timeout=timedelta(seconds=30), use_libuv=False)
        h = kind(client, _Settings(*self.args), connect=lambda: beat)
        self.handlers.append(h)
        return h

    def close(self) -> None:
        for h in self.handlers:
            h._stop_heartbeats()


@pytest.fixture
def cluster(port: int) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(*args: Any, **kwargs: Any) -> Cluster:
        made.append(Cluster(port, *args, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


def join_all(handlers: list[OwnedRendezvousHandler], timeout: float = 20) -> dict[int, tuple[int, int]]:
    """Each handler's (rank, world) from one next_rendezvous, all at once; raises what any raised."""
    out: dict[int, tuple[int, int]] = {}
    errors: list[BaseException] = []

    def one(i: int, h: OwnedRendezvousHandler) -> None:
        try:
            got = h.next_rendezvous()  # NVRx 0.4's agent takes a tuple, 0.6+'s torch's RendezvousInfo
            out[i] = (got.rank, got.world_size) if hasattr(got, "rank") else tuple(got[1:])
        except BaseException as err:  # noqa: BLE001 - re-raised below
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i, h), daemon=True) for i, h in enumerate(handlers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    assert len(out) == len(handlers), "a node never finished its round"
    return out


def test_a_lost_node_is_replaced_without_waiting_for_its_keep_alive(cluster: Any) -> None:
    c = cluster("replace", 4, 4)
    nodes = [c.node() for _ in range(4)]
    first = join_all(nodes)
    assert sorted(r for r, _ in first.values()) == [0, 1, 2, 3] and {w for _, w in first.values()} == {4}
    lost = nodes[2]
    lost._stop_heartbeats()
    survivors = [n for n in nodes if n is not lost] + [c.node()]
    t0 = time.monotonic()
    second = join_all(survivors)
    assert time.monotonic() - t0 < KEEP_ALIVE * MISSES, "no wait for the lost node's heartbeat to expire"
    for i, n in enumerate(survivors[:3]):
        assert second[i][0] == first[nodes.index(n)][0], "a survivor keeps its rank"
    assert second[3][0] == first[2][0], "the replacement takes the lost node's rank"
    assert all(n._round == 1 for n in survivors)


def test_a_known_loss_closes_the_round_at_once_a_silent_one_after_the_expiry(cluster: Any) -> None:
    c = cluster("shrink", 1, 4)
    nodes = [c.node() for _ in range(4)]
    join_all(nodes)
    nodes[1]._stop_heartbeats()
    mark_dead(nodes[0]._store, "shrink", nodes[1]._slot)
    t0 = time.monotonic()
    known = join_all([nodes[0], nodes[2], nodes[3]])
    assert time.monotonic() - t0 < KEEP_ALIVE * MISSES
    assert sorted(r for r, _ in known.values()) == [0, 1, 2]
    nodes[3]._stop_heartbeats()  # silent: nobody says it is gone
    t0 = time.monotonic()
    silent = join_all([nodes[0], nodes[2]])
    took = time.monotonic() - t0
    assert KEEP_ALIVE * (MISSES - 1) <= took < 10, took
    assert {w for _, w in silent.values()} == {2}


def test_a_node_that_comes_after_a_full_round_waits_as_a_spare(cluster: Any) -> None:
    c = cluster("spare", 2, 2)
    a, b = c.node(), c.node()
    rank_a = join_all([a, b])[0][0]
    spare = c.node()
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(r=spare.next_rendezvous()[1:]), daemon=True)
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive() and a.num_nodes_waiting() == 0, "a spare does not make the full round restart"
    b._stop_heartbeats()  # b is lost: a restarts; the spare takes b's place
    assert join_all([a])[0] == (rank_a, 2), "a keeps its rank; the spare makes the world whole again"
    thread.join(10)
    assert got["r"][1] == 2


def test_a_new_node_makes_a_round_with_room_restart(cluster: Any) -> None:
    c = cluster("grow", 1, 3, last_call=1.5)  # round 0 closes by its last call, with both
    a, b = c.node(), c.node()
    assert {w for _, w in join_all([a, b]).values()} == {2}
    newcomer = c.node()
    thread = threading.Thread(target=newcomer.next_rendezvous, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while a.num_nodes_waiting() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.num_nodes_waiting() == 1, "the agents see a node waiting and restart for it"
    worlds = join_all([a, b])
    thread.join(10)
    assert {w for _, w in worlds.values()} == {3}


def test_closing_wakes_spares_and_stops_joins(cluster: Any) -> None:
    api = _Errors.api()  # NVRx 0.4's copy of torch elastic's, torch's own on 0.6+
    RendezvousClosedError, RendezvousGracefulExitError = api.RendezvousClosedError, api.RendezvousGracefulExitError

    c = cluster("close", 1, 1)
    a = c.node()
    join_all([a])
    spare = c.node()
    waiting = threading.Event()
    # The close must find the node waiting as a spare: a node that registered (a live member outside the round,
    # which state() already counts as a spare) but has not reached the spares' wait is a new arrival at a closed
    # rendezvous and gets RendezvousClosedError, as torch's handler gives a node not yet on its redundancy list
    # (CI, loaded: the close came in that gap).
    spare.on_spare = SimpleNamespace(waiting=lambda nodes, max_nodes: waiting.set(), joining=lambda: None)
    caught: list[BaseException] = []

    def wait_as_spare() -> None:
        try:
            spare.next_rendezvous()
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            caught.append(err)

    thread = threading.Thread(target=wait_as_spare, daemon=True)
    thread.start()
    assert waiting.wait(20), "the node waits as a spare"
    assert len(a.state().spares) == 1, "the spare waits, alive"
    assert a.shutdown() is True and a.is_closed()
    thread.join(10)
    assert caught and isinstance(caught[0], RendezvousGracefulExitError)
    assert a.state().spares == (), "a spare that saw the close marked itself gone (the store host waits for none)"
    with pytest.raises(RendezvousClosedError):
        c.node().next_rendezvous()


def test_the_store_host_outlives_a_spare_that_has_not_seen_the_close(cluster: Any, port: int) -> None:
    """The store host's end (ResctlAgent._wait_for_peers, in place of NVRx 0.6+'s fixed 3 s): a round of one
    node, no peers to wait for, but a live spare in a full round (launch.nnodes' maximum = the round's size)
    still reads the store: the host waits for it (a spare lost the store in CI, exit 1), then goes at once."""

    from resctl.launch.agent import ResctlAgent

    c = cluster("host-end", 1, 1)
    a = c.node()
    join_all([a])
    spare = c.node()
    spare._register()  # a live member outside the round: what a spare is until it sees the close
    host = object.__new__(ResctlAgent)
    host._worker_group = SimpleNamespace(store=dist.TCPStore("127.0.0.1", port, None, False), group_world_size=1,
                                         spec=SimpleNamespace(rdzv_handler=a))
    t0 = time.monotonic()
    host._wait_for_peers(0.6)
    assert time.monotonic() - t0 >= 0.6, "returned while the spare still read the store"
    spare._stop_heartbeats()
    spare.remove_this_node()
    t0 = time.monotonic()
    host._wait_for_peers(30)
    assert time.monotonic() - t0 < 25, "waited on after the spare had gone"


def test_num_nodes_counts_members_that_have_not_left(cluster: Any) -> None:
    c = cluster("members", 2, 2)
    a, b = c.node(), c.node()
    join_all([a, b])
    assert a.num_nodes() == 2
    b._stop_heartbeats()
    b.remove_this_node()
    assert a.num_nodes() == 1


def test_a_round_whose_last_arrival_died_before_closing_it_is_closed_by_a_keep_alive(cluster: Any, port: int) -> None:
    from resctl.launch.rdzv_rounds import Joiner, Keys

    c = cluster("backup", 3, 3)
    a = c.node()
    raw = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=30), use_libuv=False)
    keys = Keys("backup")

    def ghost(index: int) -> None:  # an agent that joins and dies at once: never polls, never closes
        slot = int(raw.add(keys.members, 1)) - 1
        assert int(raw.add(keys.joined(0), 1)) - 1 == index
        raw.set(keys.joiner(0, index), Joiner(slot, -1, -1, 1, "default").encode())

    raw.compare_set(keys.current, "", "0")
    ghost(0)  # the round's leader
    got: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: got.update(r=a.next_rendezvous()[1:]), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while int(raw.add(keys.joined(0), 0)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    ghost(2)  # the arrival that made the round full
    thread.join(10)
    assert got["r"][1] == 3, "closed by the surviving node's keep-alive thread"


def test_a_spare_waits_past_the_join_timeout(port: int) -> None:
    """As on NVRx's redundancy list: a spare waits for a failure as long as it takes."""
    c = Cluster(port, "patient", 1, 1)
    c.args = ("patient", 1, 1, 0.5, 30.0, KEEP_ALIVE, MISSES, True)  # a join timeout of 0.5 s
    try:
        a = c.node()
        join_all([a])
        spare = c.node()
        got: dict[str, Any] = {}

        def wait_as_spare() -> None:
            try:
                got["r"] = spare.next_rendezvous()[1:]
            except Exception as err:  # noqa: BLE001 - the test looks at it
                got["error"] = err

        thread = threading.Thread(target=wait_as_spare, daemon=True)
        thread.start()
        time.sleep(1.5)
        assert thread.is_alive() and not got, "still waiting, past the join timeout"
        a._stop_heartbeats()
        join_all([a])  # a restarts alone (max 1): the spare's round opens, a takes it; the spare waits on
        thread.join(0.5)
        assert thread.is_alive()
        a.set_closed()  # the job ends: the spare leaves
        thread.join(10)
        assert not thread.is_alive() and type(got.get("error")).__name__ == "RendezvousGracefulExitError", got
    finally:
        c.close()


def test_worker_states_are_refused_with_the_fix(cluster: Any) -> None:
    # The min-healthy policy's calls: the profile refuses the pairing, and a launcher that calls them
    # anyway gets resctl's error naming the setting to change, not a bare NotImplementedError.
    from resctl.errors import LaunchError

    node = cluster("states", 1, 1).node()
    for call in (lambda: node.get_worker_states(), lambda: node.try_set_worker_state(None)):
        with pytest.raises(LaunchError, match='launch.rendezvous = "nvrx"'):
            call()


# --- the typed state the features outside the rendezvous read (issue 30) ---------------------------

def _agent_of(handler: Any, nodes: int) -> Any:

    return SimpleNamespace(_worker_group=SimpleNamespace(spec=SimpleNamespace(rdzv_handler=handler),
                                                         group_world_size=nodes))


def _wait(pred: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_member_that_goes_silent_while_the_round_trains_is_lost_to_its_watcher(cluster: Any) -> None:
    """A machine gone tells no one: the member after it in arrival order sees its keep-alive stop, opens the next
    round and asks its agent for a restart (num_nodes_waiting); the restart round closes without it. A member
    that left (its stop, the job's end) is no loss."""
    c = cluster("watch", 1, 3)
    nodes = [c.node() for _ in range(3)]
    join_all(nodes)
    left = nodes[0]
    left._stop_heartbeats()
    left.remove_this_node()
    time.sleep(2 * KEEP_ALIVE * MISSES + 4 * KEEP_ALIVE)
    assert not any(n._peer_lost for n in nodes), "a member that left is not lost"
    assert [n.num_nodes_waiting() for n in nodes[1:]] == [0, 0] and not nodes[1].next_round_open()
    join_all(nodes[1:])  # the next round, of the two
    lost, survivor = nodes[1], nodes[2]
    lost._stop_heartbeats()  # silent: no beat, no word
    t0 = time.monotonic()
    _wait(lambda: survivor._peer_lost)
    assert time.monotonic() - t0 >= 2 * KEEP_ALIVE * MISSES - KEEP_ALIVE
    assert survivor._watch is not None and survivor._watch.slot == lost._slot
    assert survivor.num_nodes_waiting() == 1 and survivor.next_round_open()
    (again,) = join_all([survivor]).values()
    assert again[1] == 1 and not survivor._peer_lost, "the restart round closed without the lost member"


def test_resctl_run_marks_its_launchers_slot_dead_or_left(cluster: Any, port: int, tmp_path: Any) -> None:
    """After the launcher exits, its `resctl run` says so for it: dead when it was killed, left when it stopped on
    SIGTERM (NVRx >= 0.6's launcher leaves without a word then: the watch must not take it for a loss); nothing
    after another exit, nor when the store is gone (at once: no retries of a refused port)."""
    from resctl.launch.rdzv_rounds import SLOT_FILE, Keys

    c = cluster("gone", 1, 3)
    a, b, d = c.node(), c.node(), c.node()
    join_all([a, b, d])
    for node, code, said in ((a, -9, b"dead"), (b, 143, b"left")):
        node._stop_heartbeats()
        (tmp_path / SLOT_FILE.format(pid=7)).write_text(str(node._slot))
        assert mark_launcher_gone(tmp_path, 7, f"127.0.0.1:{port}", "gone", code)
        assert d._store.get(Keys("gone").heartbeat(node._slot)) == said
        assert not (tmp_path / SLOT_FILE.format(pid=7)).exists()
    (tmp_path / SLOT_FILE.format(pid=8)).write_text(str(d._slot))
    assert not mark_launcher_gone(tmp_path, 8, f"127.0.0.1:{port}", "gone", 0)
    (tmp_path / SLOT_FILE.format(pid=9)).write_text(str(d._slot))
    t0 = time.monotonic()
    assert not mark_launcher_gone(tmp_path, 9, "127.0.0.1:1", "gone", -9)
    assert time.monotonic() - t0 < 1.5, "a refused port is given up at once"


def test_a_spare_says_so_once_and_the_state_counts_it_for_a_peers_stop(cluster: Any) -> None:
    import io

    from resctl.launch import spares

    c = cluster("view", 2, 2)
    a, b = c.node(), c.node()
    join_all([a, b])
    state = a.state()
    assert (state.round, state.size, state.spares, state.next_open) == (0, 2, (), False)
    assert state.full_with(2) and not state.full_with(3)
    console = io.StringIO()
    assert spares.decide_after_peer_stop(_agent_of(a, 2), console) is True  # no spare, a fixed 2: stop too
    assert 'launch.nnodes = "2" and no spare node is waiting' in console.getvalue()

    spare = c.node()
    spare.on_spare = spares.SpareConsole(io.StringIO())
    thread = threading.Thread(target=spare.next_rendezvous, daemon=True)
    thread.start()
    _wait(lambda: spare.on_spare._console.getvalue() != "", 20)  # at the spares' wait (state() counts it earlier)
    assert len(a.state().spares) == 1
    for _ in range(3):  # the spare's keep-alive ticks; still one line
        time.sleep(KEEP_ALIVE)
    said = spare.on_spare._console.getvalue()
    assert said.count("\n") == 1 and "this node is a spare: the job has its 2 node(s) (launch.nnodes maximum 2)" in said
    console = io.StringIO()
    room = spares.room(_agent_of(a, 2))
    assert room is not None and room.waiting == 1
    assert spares.decide_after_peer_stop(_agent_of(a, 2), console) is False
    assert "a spare node takes its place (1 waiting)" in console.getvalue()

    b._stop_heartbeats()
    b.remove_this_node()  # b left: a restarts with the spare
    join_all([a])
    thread.join(10)
    assert spare.on_spare._console.getvalue().endswith(spares.JOINING_LINE)
    state = a.state()
    assert (state.round, state.size, state.spares) == (1, 2, ())


def test_the_preflight_waits_for_a_full_round_of_resctls_rendezvous(cluster: Any, port: int) -> None:
    from resctl.launch import spares

    c = cluster("prefl", 2, 2)
    a, b = c.node(), c.node()
    endpoint = f"127.0.0.1:{port}"
    assert spares.wait_for_full_round(endpoint, "prefl", 2, timeout=0.6, poll=0.1) is False, "no round yet"
    join_all([a, b])
    assert spares.wait_for_full_round(endpoint, "prefl", 2, timeout=5, poll=0.1) is True
    assert spares.wait_for_full_round(endpoint, "prefl", 3, timeout=0.6, poll=0.1) is False


def test_nvrx_06s_agent_drives_resctls_rendezvous_by_its_barrier_names(cluster: Any) -> None:
    """What NVRx >= 0.6's agent calls (launcher.py of 0.7.0), against real handlers on a real store."""
    from torch.distributed.elastic.rendezvous.api import RendezvousInfo

    from resctl.launch.rdzv_install import BarrierAgentHandler, _reasons

    c = cluster("barrier", 2, 2)
    a, b = c.node(BarrierAgentHandler), c.node(BarrierAgentHandler)
    a.local_addr = b.local_addr = "127.0.0.1"  # --local-addr: rank 0's names the workers' store
    assert a.round() == 0 and a.use_agent_store is False and not a.attribution_stop_requested()
    infos: dict[str, Any] = {}
    threads = [threading.Thread(target=lambda n=n, h=h: infos.update({n: h.next_rendezvous()}), daemon=True)
               for n, h in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert all(isinstance(i, RendezvousInfo) for i in infos.values())
    assert sorted(i.rank for i in infos.values()) == [0, 1] and {i.world_size for i in infos.values()} == {2}
    assert infos["a"].bootstrap_store_info.master_port == infos["b"].bootstrap_store_info.master_port
    assert {i.bootstrap_store_info.master_addr for i in infos.values()} == {"127.0.0.1"}
    assert not a.is_next_round_open() and not b.is_next_round_open()

    a._barrier_state.open_rendezvous()  # a's workers failed: it opens the next round, b's agent sees it
    assert b.is_next_round_open()
    join_all([a, b])
    assert a.round() == 1 and not b.is_next_round_open()

    graceful, failure, no_restart = _reasons()
    a.shutdown()  # the job ended well here: the other node's agent is not told to restart
    assert a.is_closed() and not b.is_next_round_open() and b.no_restart_reason() is None
    assert not b.is_shutdown_due_to_failure()


def test_a_failure_or_a_no_restart_reason_reaches_every_node(cluster: Any) -> None:
    from resctl.launch.rdzv_install import BarrierAgentHandler, _reasons

    graceful, failure, no_restart = _reasons()
    c = cluster("reasons", 2, 2)
    a, b = c.node(BarrierAgentHandler), c.node(BarrierAgentHandler)
    join_all([a, b])
    a.signal_no_restart("no_progress")
    assert b.is_next_round_open(), "the healthy agents' poll sees it"
    assert b.no_restart_reason() == ("no_progress" if "no_progress" in no_restart else None)
    c2 = cluster("failure", 1, 1)
    d, e = c2.node(BarrierAgentHandler), c2.node(BarrierAgentHandler)
    join_all([d])
    assert d.shutdown_due_to_failure() is True
    assert e.is_shutdown_due_to_failure() and e.is_closed() and e.close_reason() == failure



def test_a_spare_answers_why_the_job_closed_after_the_store_host_is_gone() -> None:
    """NVRx 0.7's agent asks a spare's handler why the rendezvous closed (no_restart_reason, then
    is_shutdown_due_to_failure) after the spare marked itself gone, and the store host goes as soon as no
    live spare is left (ResctlAgent._wait_for_peers): the spare's questions met no store (CI: store_lost,
    exit 95 where the job had ended well). The reason is read when the close is seen, before the mark."""
    import subprocess
    import sys

    from resctl.launch import store_guard
    from resctl.launch.rdzv_install import BarrierAgentHandler, _reasons

    host = subprocess.Popen([sys.executable, "-c", "import sys, time, datetime, torch.distributed as d; "
                             "s = d.TCPStore('127.0.0.1', 0, None, True, timeout=datetime.timedelta(seconds=30), "
                             "use_libuv=False); print(s.port, flush=True); time.sleep(600)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(host.stdout.readline())
        lost: list[BaseException] = []

        def guarded_lost(err: BaseException) -> Any:
            lost.append(err)
            raise err

        c = Cluster(port, "closed-host", 1, 1)
        a = c.node(BarrierAgentHandler)
        join_all([a])
        spare = c.node(BarrierAgentHandler)
        spare._store = store_guard.StoreGuard(spare._store, guarded_lost)  # as a node that does not host it
        waiting = threading.Event()
        spare.on_spare = SimpleNamespace(waiting=lambda nodes, max_nodes: waiting.set(), joining=lambda: None)
        caught: list[BaseException] = []
        thread = threading.Thread(target=lambda: _catch(spare.next_rendezvous, caught), daemon=True)
        thread.start()
        assert waiting.wait(20), "the node waits as a spare"
        failure = _reasons()[1]
        assert a.shutdown_due_to_failure() is True  # a terminal failure elsewhere: not a graceful end
        thread.join(10)
        assert caught and isinstance(caught[0], _Errors.api().RendezvousGracefulExitError)
        assert a.state().spares == (), "the spare marked itself gone: the store host may leave now"
        c.close()
        host.kill()
        host.wait()
        assert spare.is_shutdown_due_to_failure() and spare.no_restart_reason() is None
        assert spare.close_reason() == failure and lost == [], "answered from the close it saw, not the store"
    finally:
        host.kill()
        host.wait()


def _catch(call: Any, caught: list[BaseException]) -> None:
    try:
        call()
    except BaseException as err:  # noqa: BLE001 - the test looks at it
        caught.append(err)

def test_the_preflight_wait_on_nvrx_06s_own_rendezvous_says_it_needs_resctls() -> None:
    import importlib.util

    from resctl.launch import spares

    nvrx_04 = importlib.util.find_spec("nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat") is not None
    if nvrx_04:  # NVRx 0.4/0.5's own state can be read (the opt-out as before)
        assert callable(spares._full_round_reader("run", 2, "nvrx"))
    else:
        with pytest.raises(spares.UnreadableRendezvous, match='launch.rendezvous = "auto", the default'):
            spares.wait_for_full_round("127.0.0.1:1", "run", 2, timeout=0.1, rendezvous="nvrx")
    assert callable(spares._full_round_reader("run", 2, "resctl"))


INSTALL_SNIPPET = r"""
import os, socket, sys
from resctl.patching import Patches
from resctl.launch import rdzv_install
from nvidia_resiliency_ext.fault_tolerance import launcher
patches = Patches("t")
assert not rdzv_install.install(patches, env={})  # NVRx's own: nothing changes
original = launcher._register_ft_rdzv_handler
assert rdzv_install.install(patches, env={"RESCTL_RDZV": "resctl", "RESCTL_RDZV_KEEP_ALIVE": "0.5"})
launcher._register_ft_rdzv_handler()  # what ft_launcher's main calls
try:
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous import registry, RendezvousParameters
except ImportError:
    from torch.distributed.elastic.rendezvous import registry, RendezvousParameters
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
params = RendezvousParameters("c10d", f"127.0.0.1:{port}", "inst", 1, 1, local_addr="127.0.0.1", is_host="1")
handler = registry.get_rendezvous_handler(params)
print(type(handler).__name__, handler.settings.keep_alive, type(handler.on_spare).__name__)
patches.undo()
assert launcher._register_ft_rdzv_handler is original
"""


def test_install_puts_resctls_handler_where_ft_launcher_registers_its_own(tmp_path: Any) -> None:
    """Through ft_launcher's own registration (a child process: the registry is global), the handler for
    this NVRx: NVRx 0.4's agent gets the plain handler, 0.6+'s the one that answers its barrier names."""
    import importlib.util
    import os
    import subprocess
    import sys

    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", INSTALL_SNIPPET], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    nvrx_04 = importlib.util.find_spec("nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat") is not None
    kind = "OwnedRendezvousHandler" if nvrx_04 else "BarrierAgentHandler"
    assert out.stdout.split()[-3:] == [kind, "0.5", "SpareConsole"], out.stdout
