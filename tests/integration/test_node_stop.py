"""SIGTERM to one node only (Kubernetes evicts one pod, Slurm signals one node's step), on network-namespace
nodes, with no spare (docs/recovery.md, "SIGTERM to one node"; a spare: test_hot_spare.py). Every rank saves
the final checkpoint at one agreed step; then

- `launch.nnodes = "2"`: the job cannot go on without the node, so the other node stops too, at once (not
  after the rendezvous' join timeout) and with exit 143, as for its own SIGTERM; started again (the
  scheduler's restart), the job resumes from that step and ends bitwise equal to a fault-free torchrun run;
- `launch.nnodes = "1:2"`: the other node goes on alone from that step and finishes (exit 0).

Needs root, iproute2 and tc; skipped with the reason otherwise.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.integration.netns_cluster import cluster
from tests.integration.node_jobs import STEPS, Nodes, ckpt_reference  # noqa: F401 - a fixture
from tests.integration.test_recovery import assert_same_final

pytestmark = pytest.mark.slow
PORT = 29731
# Well inside the rendezvous' join timeout (60 s here, 600 s by default), which is what the other node waited before.
STOP_WITHIN = 30


def _sigterm_node_1_at_step_20(nodes: Nodes) -> float:
    nodes.start(0)
    nodes.start(1)
    nodes.wait(lambda: nodes.started() == set(range(2 * nodes.nproc)), 120, "the two nodes' workers")
    nodes.release()
    nodes.wait(lambda: nodes.top() >= 20, 60, "step 20")
    os.kill(nodes.procs[1].pid, signal.SIGTERM)  # `ip netns exec` execs: this is node 1's `resctl run`
    return time.monotonic()


def _agreed_stop(nodes: Nodes) -> int:
    stops = {e["rank"]: e for e in nodes.events() if e["kind"] == "stop"}
    ranks = range(2 * nodes.nproc)
    assert {r: e["outcome"] for r, e in stops.items()} == dict.fromkeys(ranks, "agreed"), (stops, nodes.consoles())
    assert len({stops[r]["step"] for r in ranks}) == 1 and stops[0]["step"] >= 20, stops
    return int(stops[0]["step"])


def test_a_fixed_size_job_stops_everywhere_and_resumes_from_the_final_checkpoint(
        tmp_path: Path, ckpt_reference: Path) -> None:  # noqa: F811
    with cluster(2) as c:
        nodes = Nodes(c, tmp_path, "2", PORT)
        signalled = _sigterm_node_1_at_step_20(nodes)
        codes = nodes.finish([0, 1], 120)
        took = time.monotonic() - signalled
        assert codes == {0: 143, 1: 143}, nodes.consoles()
        assert took < STOP_WITHIN, f"the other node stopped {took:.1f} s after the SIGTERM\n{nodes.consoles()}"
        said = nodes.said(0)
        assert "the job cannot go on without that node (launch.nnodes = \"2\" and no spare node is waiting)" in said
        assert "resctl: stopped with the job" in said and "exit 143" in said, said
        stop = _agreed_stop(nodes)
        assert nodes.top() == stop, "no rank trained past the stop step"
        # The scheduler's restart of the whole job (a requeue, the pods recreated): both nodes again.
        nodes.start(0)
        nodes.start(1)
        codes = nodes.finish([0, 1], 150)
        assert codes == {0: 0, 1: 0}, nodes.consoles()
    assert f"[rank 0] resumed from checkpoint step {stop}" in nodes.said(0), nodes.consoles()
    assert_same_final(tmp_path / "final.pt", ckpt_reference)


def test_a_node_range_goes_on_without_the_stopped_node(tmp_path: Path) -> None:
    with cluster(2) as c:
        nodes = Nodes(c, tmp_path, "1:2", PORT)
        _sigterm_node_1_at_step_20(nodes)
        codes = nodes.finish([0, 1], 150)
    assert codes == {0: 0, 1: 143}, nodes.consoles()
    said = nodes.said(0)
    assert 'the job goes on without that node: launch.nnodes = "1:2" allows 1 node(s)' in said, said
    stop = _agreed_stop(nodes)
    ev = nodes.events()
    resumes = [e for e in ev if e["kind"] == "resume" and e["step"] > 0]
    assert [(e["rank"], e["step"]) for e in resumes] == [(0, stop)], "node 0 alone, from the stop step"
    after = [e for e in ev if e["kind"] == "step" and e["t"] > resumes[0]["t"]]
    assert {e["rank"] for e in after} == {0} and max(e["step"] for e in after) == STEPS


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_a_peer_stop_waits_for_each_local_ranks_final_save(tmp_path: Path, start: str) -> None:
    """Two workers a node, node 1 SIGTERMed, launch.nnodes = "2". On node 0 the ranks leave on the peer's stop,
    each after its final save, and rank 0's takes 4 s longer (it writes the replicated state: the largest
    part): its launcher must not take local rank 1's exit after its save for a failure and stop rank 0 for a
    restart (0.5 s later, mid-save: the final checkpoint was lost, and the console said every rank saved it).
    No periodic checkpoint: the final one is the only one, and the next start resumes from it."""
    with cluster(2) as c:
        nodes = Nodes(c, tmp_path, "2", PORT, nproc=2, script_args=("--save-time", "0@4"),
                      options=("--set", "checkpoint.interval_steps=1000", "--set", f"launch.worker_start={start}"))
        _sigterm_node_1_at_step_20(nodes)
        codes = nodes.finish([0, 1], 120)
        assert codes == {0: 143, 1: 143}, nodes.consoles()
        stop = _agreed_stop(nodes)
        nodes.start(0)
        nodes.start(1)
        codes = nodes.finish([0, 1], 150)
        assert codes == {0: 0, 1: 0}, nodes.consoles()
    assert f"[rank 0] resumed from checkpoint step {stop}" in nodes.said(0), nodes.consoles()
