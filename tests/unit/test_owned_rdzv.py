"""resctl's rendezvous handler (resctl.launch.owned_rdzv) on a real TCPStore, one handler per
simulated node in threads: rounds, a lost node with and without a replacement, spares, closing,
and what the launcher reads (num_nodes_waiting, num_nodes). The multi-process runs under the real
ft_launcher are tests/integration/test_owned_rdzv.py."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any, Iterator

import pytest

dist = pytest.importorskip("torch.distributed")
from resctl.launch.owned_rdzv import OwnedRendezvousHandler, _Settings, mark_dead  # noqa: E402

KEEP_ALIVE, MISSES = 0.2, 3


@pytest.fixture
def port() -> Iterator[int]:
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), use_libuv=False)
    yield server.port


class Cluster:
    def __init__(self, port: int, run_id: str, min_nodes: int, max_nodes: int, last_call: float = 30.0) -> None:
        self.port, self.args = port, (run_id, min_nodes, max_nodes, 30.0, last_call, KEEP_ALIVE, MISSES, True)
        self.handlers: list[OwnedRendezvousHandler] = []

    def node(self) -> OwnedRendezvousHandler:
        client = dist.TCPStore("127.0.0.1", self.port, None, False, timeout=timedelta(seconds=30), use_libuv=False)
        beat = dist.TCPStore("127.0.0.1", self.port, None, False, timeout=timedelta(seconds=30), use_libuv=False)
        h = OwnedRendezvousHandler(client, _Settings(*self.args), connect=lambda: beat)
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
            _, rank, world = h.next_rendezvous()
            out[i] = (rank, world)
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
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.api import (
        RendezvousClosedError,
        RendezvousGracefulExitError,
    )

    c = cluster("close", 1, 1)
    a = c.node()
    join_all([a])
    spare = c.node()
    caught: list[BaseException] = []

    def wait_as_spare() -> None:
        try:
            spare.next_rendezvous()
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            caught.append(err)

    thread = threading.Thread(target=wait_as_spare, daemon=True)
    thread.start()
    time.sleep(0.5)
    assert a.shutdown() is True and a.is_closed()
    thread.join(10)
    assert caught and isinstance(caught[0], RendezvousGracefulExitError)
    with pytest.raises(RendezvousClosedError):
        c.node().next_rendezvous()


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
