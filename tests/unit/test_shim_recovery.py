"""Unit tests for the shim's recovery pieces: drills, in-process settings, gloo connection cut."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from resctl.errors import ProfileError
from resctl.profile.load import resolve
from resctl.profile.schema import InProcess, Profile
from resctl.shim.faults import FaultPlan, parse_schedule
from resctl.shim.inprocess import GlooSockets
from resctl.shim.runtime import Shim


def test_schedule_parses_and_fires_once_per_run(tmp_path) -> None:
    schedule = parse_schedule("exception@8:1,sigkill@12,hang@13:1")
    assert schedule[1] == {"kind": "sigkill", "step": 12, "rank": 0}
    plan = FaultPlan(schedule, rank=1, run_dir=tmp_path)
    assert plan.take(8, "exception") and not plan.take(8, "exception")
    # A restarted incarnation (new FaultPlan, same run dir) does not fire it again.
    assert not FaultPlan(schedule, rank=1, run_dir=tmp_path).take(8, "exception")
    assert FaultPlan(schedule, rank=1, run_dir=tmp_path).take(13, "hang")


def test_nvrx_orderings_are_profile_errors_with_the_keys() -> None:
    """NVRx's Wrapper asserts these orderings only when a worker starts; the profile refuses them first."""
    with pytest.raises(ProfileError, match=r"heartbeat_timeout \(30s\) must be shorter than barrier_timeout"):
        resolve(None, env={}, cwd=Path("/nonexistent"),
                sets=["inprocess.soft_timeout=5s", "inprocess.hard_timeout=8s", "inprocess.barrier_timeout=15s"])
    resolve(None, env={}, cwd=Path("/nonexistent"), sets=[
        "inprocess.soft_timeout=5s", "inprocess.hard_timeout=8s", "inprocess.barrier_timeout=15s",
        "inprocess.heartbeat_timeout=10s"])
    InProcess(soft_timeout=5, hard_timeout=8, barrier_timeout=15, heartbeat_timeout=10)


def test_progress_pings_are_rate_limited_and_reset_per_iteration() -> None:
    shim = Shim(Profile(), None, env={})
    pings: list[float] = []
    shim.set_progress(lambda: pings.append(time.monotonic()))
    for _ in range(50):
        shim.ping()
    assert len(pings) == 1
    shim.set_progress(lambda: pings.append(time.monotonic()))  # a new iteration pings at once
    shim.ping()
    assert len(pings) == 2


def test_cutting_tracked_connections_wakes_a_blocked_reader() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    tracker = GlooSockets()
    holder: dict[str, socket.socket] = {}

    def connect() -> None:
        holder["client"] = socket.create_connection(("127.0.0.1", port))

    tracker.track(connect)()
    peer, _ = server.accept()
    result: dict[str, bytes] = {}
    reader = threading.Thread(target=lambda: result.setdefault("data", holder["client"].recv(10)))
    reader.start()
    time.sleep(0.1)
    assert reader.is_alive(), "blocked in recv"
    assert tracker.cut() == 1  # the listening socket was not created inside track(), and is never cut
    reader.join(2)
    assert not reader.is_alive() and result["data"] == b""
    for s in (peer, holder["client"], server):
        s.close()


def test_a_store_client_accepted_meanwhile_is_never_cut() -> None:
    # Rank 0 serves the wrapper's store: a peer's NVRx monitor that connects while the script's
    # init_process_group runs (a loaded box) must keep its connection through an abort (CI: cut, the
    # monitor died with "Broken pipe" and the next fault waited for the heartbeat timeout).
    store = socket.create_server(("127.0.0.1", 0))
    gloo = socket.create_server(("127.0.0.1", 0))
    tracker = GlooSockets(served_ports=frozenset({store.getsockname()[1]}))
    held: list[socket.socket] = []

    def init_process_group() -> None:
        monitor = socket.create_connection(("127.0.0.1", store.getsockname()[1]))
        held.extend([monitor, store.accept()[0]])  # the store's side of the monitor's connection
        peer = socket.create_connection(("127.0.0.1", gloo.getsockname()[1]))
        held.extend([peer, gloo.accept()[0]])  # a gloo pair: both ends in this process here

    tracker.track(init_process_group)()
    assert tracker.cut() == 2  # the gloo pair's two ends; neither end of the store connection
    monitor, served = held[0], held[1]
    monitor.sendall(b"ping")
    assert served.recv(4) == b"ping"
    for s in (*held, store, gloo):
        s.close()
