"""resctl/launch/spares.py and the workers' left-on-a-stop markers (resctl/launch/stop.py): whether a job goes
on without a node that stopped, read from a real NVRx rendezvous state; the markers a launcher believes.
The multi-node behaviour: tests/integration/test_hot_spare.py and test_node_stop.py."""

from __future__ import annotations

import io
import os
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from resctl.launch import spares, stop

# NVRx 0.4's c10d rendezvous state (0.6+ has only its barrier rendezvous): the "nvrx" opt-out on the 0.4 series.
rdzv = pytest.importorskip("nvidia_resiliency_ext.fault_tolerance._ft_rendezvous", reason="NVRx 0.4's rendezvous")


@pytest.mark.parametrize("nodes, lo, hi, waiting, goes_on, why", [
    (2, 2, 2, 0, False, 'launch.nnodes = "2" and no spare node is waiting'),
    (2, 2, 2, 1, True, "a spare node takes its place (1 waiting)"),
    (2, 1, 2, 0, True, 'launch.nnodes = "1:2" allows 1 node(s)'),
    (3, 2, 3, 0, True, 'launch.nnodes = "2:3" allows 2 node(s)'),
    (1, 1, 1, 0, False, 'launch.nnodes = "1" and no spare node is waiting'),
])
def test_the_job_goes_on_when_a_spare_waits_or_the_range_allows_one_node_fewer(
        nodes: int, lo: int, hi: int, waiting: int, goes_on: bool, why: str) -> None:
    room = spares.Room(nodes, lo, hi, waiting)
    assert room.goes_on() is goes_on
    assert room.why() == why


def _node(addr: str) -> Any:
    return rdzv._NodeDesc(addr, 1, 0)


class _Holder:
    """Stands in for the store-backed holder: hands out `state`, counts the reads that skipped the cache."""

    def __init__(self, state: Any) -> None:
        self.state, self._last_sync_time, self.fresh_reads = state, 1e18, 0

    def sync(self) -> None:
        if self._last_sync_time == float("-inf"):
            self.fresh_reads += 1


def _agent(state: Any, nodes: int, lo: int, hi: int, prev: dict[Any, int]) -> Any:
    handler = SimpleNamespace(_state_holder=_Holder(state), _settings=SimpleNamespace(min_nodes=lo, max_nodes=hi),
                              _heartbeat_lock=threading.Lock(),
                              _op_executor=SimpleNamespace(_prev_participants=prev))  # where NVRx 0.4.1 keeps them
    return SimpleNamespace(_worker_group=SimpleNamespace(spec=SimpleNamespace(rdzv_handler=handler),
                                                         group_world_size=nodes))


def test_a_spare_on_any_list_or_already_in_the_next_round_counts() -> None:
    a, b, spare = _node("10.0.0.1"), _node("10.0.0.2"), _node("10.0.0.3")
    for place in ("redundancy_list", "wait_list", "participants"):
        state = rdzv._RendezvousState()
        state.participants = {a: 0, b: 1}
        if place == "participants":  # b has left and the spare joined the round to come
            state.participants = {a: 0, spare: 0}
        else:
            getattr(state, place).add(spare)
        agent = _agent(state, 2, 2, 2, prev={a: 0, b: 1})
        room = spares.room(agent)
        assert room is not None and room.waiting == 1 and room.goes_on(), place
        assert agent._worker_group.spec.rdzv_handler._state_holder.fresh_reads == 1, "read the store, not the cache"


def test_no_spare_and_a_fixed_size_stops_this_node_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spares, "RECHECK_SECONDS", 0.0)
    state = rdzv._RendezvousState()
    a, b = _node("10.0.0.1"), _node("10.0.0.2")
    state.participants = {a: 0, b: 1}
    console = io.StringIO()
    assert spares.decide_after_peer_stop(_agent(state, 2, 2, 2, prev={a: 0, b: 1}), console) is True
    assert console.getvalue().count("\n") == 1
    assert 'cannot go on without that node (launch.nnodes = "2" and no spare node is waiting)' in console.getvalue()
    console = io.StringIO()
    assert spares.decide_after_peer_stop(_agent(state, 2, 1, 2, prev={a: 0, b: 1}), console) is False
    assert "goes on without that node" in console.getvalue()


def test_another_rendezvous_shape_keeps_nvrx_restart_and_an_unreadable_one_stops() -> None:
    console = io.StringIO()
    assert spares.decide_after_peer_stop(SimpleNamespace(), console) is False, "NVRx >= 0.6's own: as before"
    assert console.getvalue().count("\n") == 1 and 'cannot be read by resctl, so NVRx restarts' in console.getvalue()
    console = io.StringIO()

    class Gone(_Holder):
        def sync(self) -> None:
            raise ConnectionError("store gone with the leaving host")

    a = _node("10.0.0.1")
    state = rdzv._RendezvousState()
    agent = _agent(state, 2, 2, 2, prev={a: 0})
    agent._worker_group.spec.rdzv_handler._state_holder = Gone(state)
    assert spares.decide_after_peer_stop(agent, console) is True
    assert "the rendezvous cannot be read (ConnectionError: store gone with the leaving host)" in console.getvalue()


def test_the_launcher_believes_only_its_own_left_markers(tmp_path: Path) -> None:
    marker = stop.file_for(os.getpid())
    env = {stop.ENV: str(marker)}
    try:
        assert stop.left(marker) == set()
        stop.mark_left(env, 101, stop.PEER)
        stop.mark_left(env, 102, stop.PEER)
        assert stop.left(marker) == {stop.PEER}
        stop.mark_left(env, 103, stop.OWN)
        assert stop.left(marker) == {stop.PEER, stop.OWN}
        (marker.parent / "left-104").write_text("something else")
        assert stop.left(marker) == {stop.PEER, stop.OWN}, "only the two words count"
        (tmp_path / "real").write_text(stop.PEER)
        stop.clear_left(marker)
        (marker.parent / "left-105").symlink_to(tmp_path / "real")
        assert stop.left(marker) == set(), "a marker behind a link is not believed"
        stop.mark_left({}, 106, stop.PEER)  # no launcher: nothing to tell, no error
    finally:
        stop.remove(marker)
    assert not marker.parent.exists()
