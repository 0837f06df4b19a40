"""No node is special (issue 42): the rendezvous store served by `resctl store`, every `resctl run` a client
(`launch.store = "external"`), on loopback. examples/train_ckpt.py (resctl.checkpoint every 10 steps).

- node 0 (the node that would host the store under `launch.store = "node"`) lost outright after step 20:
  the survivors train again (a restart round, the rank-0 worker on a survivor), resume from the last
  checkpoint and exit 0; with a spare waiting, the spare takes the lost node's place;
- the store process killed: every node stops with the reason and exit 95 (never a hang), and the job
  started again against a restarted store resumes from its checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resctl.errors import EXIT_STORE_LOST
from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, finish, node_step, start, wait_for
from tests.integration.test_owned_rdzv import _joined_rounds, _lose
from tests.ports import free_port

pytestmark = pytest.mark.slow
SCRIPT = str(EXAMPLES / "train_ckpt.py")


def _store(tmp: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "resctl", "store", "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # "serving ..." once the port is bound and the server runs
        if "serving the rendezvous store" in line:
            return proc
    raise AssertionError(f"resctl store exited {proc.wait()} before serving")


def _node(tmp: Path, i: int, port: int, nnodes: str, steps: int) -> subprocess.Popen[str]:
    return start(["-p", str(LOCAL_PROFILE), "--nnodes", nnodes, "--nproc-per-node", "1",
                  "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "ext", "--local-addr", "127.0.0.1",
                  "--set", "launch.store=external", "--rdzv-conf", "last_call_timeout=1",
                  "--set", "launch.rdzv_keep_alive=1s", "--run-dir", str(tmp / f"node{i}"),
                  "--set", f"checkpoint.dir={tmp / 'ckpt'}", SCRIPT, "--steps", str(steps), "--step-time", "0.05",
                  "--out", str(tmp / "final.pt")], cwd=tmp)


def _top(tmp: Path, nodes: range) -> int:
    return max(node_step(tmp / f"node{i}", cycle=None) for i in nodes)


@pytest.mark.parametrize("spare", [False, True], ids=["survivors", "spare"])
def test_losing_node_0_is_a_restart_round(tmp_path: Path, spare: bool) -> None:
    port = free_port()
    store = _store(tmp_path, port)
    count = 4 if spare else 3  # nnodes 2:3: with a fourth node, one waits as a spare
    nodes = [_node(tmp_path, i, port, "2:3", steps=60) for i in range(count)]
    try:
        wait_for(lambda: _top(tmp_path, range(count)) >= 20, 240, "step 20")
        trained = [i for i in range(count) if node_step(tmp_path / f"node{i}", cycle=None) > 0]
        assert len(trained) == 3, trained
        lost = 0 if 0 in trained else trained[0]  # the node 0 of the job (under "node": the store's host)
        lost_at = time.time()
        _lose(nodes[lost].pid)
        rest = [i for i in range(count) if i != lost]
        results = {i: finish(nodes[i]) for i in rest}
    finally:
        for p in [*nodes, store]:
            _lose(p.pid)
    for i, (code, out) in results.items():
        assert code == 0, f"node {i}:\n{out[-3000:]}"
    # Who trains after the loss: the restart round takes every node that joins before its last call (1 s); on a
    # loaded box a survivor can come after it and wait as a spare (nnodes 2:3 allows a world of 2), exit 0.
    after = {i: [e for e in events(tmp_path / f"node{i}") if e["kind"] == "resume" and e["t"] > lost_at] for i in rest}
    trainers = [i for i in rest if after[i]]
    assert len(trainers) >= 2, after
    for i in trainers:
        assert after[i][0]["step"] >= 10, (i, after[i])  # from the last checkpoint, not step 0
        assert "world of size" in _joined_rounds(tmp_path / f"node{i}")[-1]
    if spare:
        (newcomer,) = [i for i in rest if i not in trained]
        assert newcomer in trainers, "the waiting spare took the lost node's place"
        assert node_step(tmp_path / f"node{newcomer}", cycle=None) == 60, "the spare trained to the end"
    assert (tmp_path / "final.pt").exists()  # rank 0 moved to a survivor and wrote it


def test_store_lost_stops_every_node_with_a_reason_and_a_restart_resumes(tmp_path: Path) -> None:
    port = free_port()
    store = _store(tmp_path, port)
    nodes = [_node(tmp_path, i, port, "2", steps=200) for i in range(2)]
    try:
        wait_for(lambda: _top(tmp_path, range(2)) >= 15, 240, "step 15")
        _lose(store.pid)
        results = [finish(p, timeout=60) for p in nodes]  # never a hang
    finally:
        for p in [*nodes, store]:
            _lose(p.pid)
    for i, (code, out) in enumerate(results):
        assert code == EXIT_STORE_LOST, f"node {i}:\n{out[-3000:]}"
        assert "the rendezvous store at 127.0.0.1" in out and "is unreachable" in out
        assert json.loads((tmp_path / f"node{i}" / "fatal.json").read_text())["cause"] == "store_lost"
    # The scheduler's restart: a new store (same port), the same commands again.
    for i in range(2):
        (tmp_path / f"node{i}" / "fatal.json").unlink()
    store = _store(tmp_path, port)
    nodes = [_node(tmp_path, i, port, "2", steps=100) for i in range(2)]
    try:
        again = [finish(p) for p in nodes]
    finally:
        for p in [*nodes, store]:
            _lose(p.pid)
    for i, (code, out) in enumerate(again):
        assert code == 0, f"node {i}:\n{out[-3000:]}"
        assert "resumed from checkpoint step" in out
