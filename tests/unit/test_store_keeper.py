"""The store host's rendezvous store in a keeper process (resctl.launch.store_keeper): when the launcher forks one,
that it serves torch's TCPStore to clients, leaves when the launcher closes its pipe or dies (SIGKILL included),
and that anything it cannot do leaves the store to NVRx as before (a taken port, another node's store)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from resctl.launch import store_keeper
from resctl.launch.store_keeper import serve_apart


@pytest.mark.parametrize("endpoint,want", [
    ("localhost:0", ("localhost", 0)), ("node-0:29400", ("node-0", 29400)), ("[::1]:29401", ("::1", 29401)),
    ("10.0.0.5", ("10.0.0.5", 29400)), ("", ("localhost", 29400)), ("[fe80::1]", ("fe80::1", 29400)),
])
def test_the_keeper_listens_where_nvrx_would_have(endpoint: str, want: tuple[str, int],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The host and port NVRx's create_backend reads from the endpoint, a port-less one included (29400, where the
    other nodes look for it), not a port of the keeper's own choosing."""
    asked: list[tuple[str, int]] = []
    monkeypatch.setattr(store_keeper, "other_threads", list)  # pytest-xdist's worker may run threads of its own
    monkeypatch.setattr(store_keeper, "start", lambda host, port, *a: asked.append((host, port)))
    assert serve_apart(RendezvousParameters("c10d", endpoint, "job", 1, 1, is_host="1"), use_libuv=True) is None
    assert asked == [want]


def test_no_keeper_while_a_thread_runs(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A launcher with a thread running (one that may hold a lock a fork would copy) hosts the store itself, and
    says so with the thread's name."""
    monkeypatch.setattr(store_keeper, "start", lambda *a: pytest.fail("forked beside a thread"))
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="holds-a-lock")
    thread.start()
    try:
        with caplog.at_level("INFO", logger=store_keeper.__name__):
            params = RendezvousParameters("c10d", "localhost:0", "job", 1, 1, is_host="1")
            assert serve_apart(params, use_libuv=True) is None
    finally:
        stop.set()
        thread.join()
    assert "hosts the rendezvous store itself" in caplog.text and "holds-a-lock" in caplog.text


@pytest.mark.parametrize("conf", [{}, {"is_host": "0"}, {"is_host": "false"}])
def test_no_keeper_unless_told_to_host(conf: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRx's own choice (no is_host: its guess by host name) and another node's store are left as they were:
    no fork at all."""
    monkeypatch.setattr(store_keeper, "start", lambda *a: pytest.fail("forked a keeper"))
    params = RendezvousParameters("c10d", "localhost:0", "job", 1, 1, **conf)
    assert serve_apart(params, use_libuv=True) is None


# One fresh interpreter (pytest's own has threads): the keeper serves, a client of it works, the launcher's
# copy of the parameters points at it, `stop` reaps it; then a keeper whose launcher is SIGKILLed goes too.
LIFE = textwrap.dedent("""
    import json, os, socket, sys, time
    from datetime import timedelta
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from resctl.launch import store_keeper

    params = RendezvousParameters("c10d", "127.0.0.1:0", "job", 1, 1, is_host="1", read_timeout="30")
    client_params, keeper = store_keeper.serve_apart(params, use_libuv=True)
    client = dist.TCPStore("127.0.0.1", keeper.port, None, False, timeout=timedelta(seconds=10))
    client.set("k", "v")
    comm = open(f"/proc/{keeper.pid}/comm").read().strip()
    threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    got = dict(value=client.get("k").decode(), comm=comm, threads=threads, pid=keeper.pid,
               endpoint=client_params.endpoint, is_host=client_params.config["is_host"],
               original=params.config["is_host"], port=keeper.port)
    keeper.stop()
    got["reaped"] = not os.path.exists(f"/proc/{keeper.pid}")
    orphan = store_keeper.start("127.0.0.1", 0, 30, True)  # this process is SIGKILLed with it running
    got["orphan"] = orphan.pid
    print(json.dumps(got), flush=True)
    time.sleep(60)
""")


def test_keeper_serves_and_leaves_with_its_launcher() -> None:
    proc = subprocess.Popen([sys.executable, "-c", LIFE], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    got = json.loads(proc.stdout.readline())
    proc.kill()
    proc.wait()
    assert got["value"] == "v" and got["comm"] == "resctl-store"
    # No store server thread in the forking process: that thread is what a fork must not copy mid-lookup.
    assert not [t for t in got["threads"] if t.startswith("pt_tcpstore")], got["threads"]
    assert got["endpoint"] == f"127.0.0.1:{got['port']}" and got["is_host"] == "0" and got["original"] == "1"
    assert got["reaped"]
    deadline = time.monotonic() + 30
    while _alive(got["orphan"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(got["orphan"]), "the keeper outlived its SIGKILLed launcher"


def test_taken_port_leaves_the_store_to_nvrx() -> None:
    """The keeper cannot bind: it says why and is reaped; the launcher then hosts the store as NVRx does
    (which fails or falls back by NVRx's own rules)."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    script = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
              "from resctl.launch import store_keeper\n"
              f"print('KEEPER', store_keeper.start('127.0.0.1', {taken.getsockname()[1]}, 5, True))\n")
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stdout
    finally:
        taken.close()
    assert "KEEPER None" in out
    assert "did not start" in out and "the launcher hosts it" in out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (reaped by init later) is gone for the test's purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
