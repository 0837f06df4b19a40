"""Two "nodes" as network namespaces on this machine, found the way pods of an Indexed Job find
each other: their own addresses and pod-like hostnames (train-0, train-1) resolvable from each
other, JOB_COMPLETION_INDEX, and the headless Service name in the profile. One node is lost
outright (every process in its namespace SIGKILLed), then comes back like a restarted pod; the job
resumes from its snapshot and ends with the same weights as a fault-free run.

Needs root and iproute2 (`ip netns`); skipped with the reason otherwise. CI runs as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.integration.jobs import (
    LOCAL_PROFILE, SNAPSHOT_SCRIPT, assert_same_weights, events, finish, last_step, wait_for,
)

pytestmark = pytest.mark.slow
JOB, SERVICE, NAMESPACE = "train", "train", "default"
SUBNET = "10.213.{}.{}"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def nodes() -> Iterator[list[str]]:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None:
        pytest.skip("needs root, iproute2 and util-linux unshare to create network namespaces")
    tag = uuid.uuid4().hex[:6]
    names = [f"rctl{tag}a", f"rctl{tag}b"]
    net = int(tag[:2], 16)
    probe = _ip("netns", "add", names[0])
    if probe.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {probe.stderr.strip()}")
    try:
        _ip("netns", "add", names[1])
        veth = [f"v{tag}a", f"v{tag}b"]
        assert _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]).returncode == 0
        hosts = ["127.0.0.1 localhost"]
        for i, (ns, dev) in enumerate(zip(names, veth)):
            addr = SUBNET.format(net, i + 1)
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            hosts.append(f"{addr} {JOB}-{i}.{SERVICE}.{NAMESPACE}.svc.cluster.local {JOB}-{i}")
        for ns in names:  # `ip netns exec` mounts /etc/netns/<ns>/* over /etc, as a pod gets its own
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text("\n".join(hosts) + "\n")
            (etc / "resolv.conf").write_text(f"search {NAMESPACE}.svc.cluster.local svc.cluster.local cluster.local\n")
        yield names
    finally:
        for ns in names:
            for pid in _ip("netns", "pids", ns).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _ip("netns", "del", ns)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def start_node(ns: str, index: int, tmp_path: Path) -> subprocess.Popen[str]:
    """A pod: its own network, hostname <job>-<index>, and the Indexed Job's environment."""
    resctl = [sys.executable, "-m", "resctl", "run", "-p", str(LOCAL_PROFILE),
              "--nnodes", "2", "--nproc-per-node", "1",
              "--set", f'launch.k8s_service="{SERVICE}"', "--set", "launch.rdzv_port=29531",
              "--set", f'launch.run_dir="{tmp_path}/runs/{{run_id}}"',
              SNAPSHOT_SCRIPT, "--steps", "40", "--step-time", "0.05",
              "--snapshot", str(tmp_path / "snapshot.pt"), "--out", str(tmp_path / "final.pt")]
    inner = f"hostname {JOB}-{index} && exec " + " ".join(f"'{a}'" for a in resctl)
    env = {**os.environ, "JOB_COMPLETION_INDEX": str(index), "POD_NAMESPACE": NAMESPACE,
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", inner], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def lose_node(ns: str) -> None:
    for pid in _ip("netns", "pids", ns).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_node_loss_and_return(nodes: list[str], tmp_path: Path, reference: Path) -> None:
    a = start_node(nodes[0], 0, tmp_path)
    b = start_node(nodes[1], 1, tmp_path)
    run_dir = tmp_path / "runs" / JOB
    try:
        wait_for(lambda: last_step(run_dir, 1) >= 15, 180, "rank 1 (node b) to reach step 15", a)
    except AssertionError as err:
        for ns in nodes:
            lose_node(ns)
        tails = [f"--- node {i} ---\n{(p.communicate(timeout=30)[0] or '')[-3000:]}" for i, p in enumerate((a, b))]
        raise AssertionError(f"{err}\n" + "\n".join(tails)) from None
    lose_node(nodes[1])
    b.wait(timeout=30)
    b_again = start_node(nodes[1], 1, tmp_path)  # the Job recreates the pod with the same index
    code_a, out_a = finish(a)
    code_b, out_b = finish(b_again)
    assert code_a == 0, out_a[-4000:]
    assert code_b == 0, out_b[-4000:]
    assert "resumed from" in out_a
    starts = [e for e in events(run_dir) if e["kind"] == "start"]
    assert {e["rank"] for e in starts} == {0, 1}
    assert max(e["cycle"] for e in starts if e["rank"] == 0) >= 1, "node a restarted its worker in-job"
    assert_same_weights(tmp_path / "final.pt", reference)
