"""Two "nodes" as network namespaces on this machine, found the way pods of an Indexed Job find
each other: their own addresses and pod-like hostnames (train-0, train-1) resolvable from each
other, JOB_COMPLETION_INDEX, and the headless Service name in the profile. One node is lost
outright (every process in its namespace SIGKILLed), then comes back like a restarted pod; the job
resumes from its snapshot and ends with the same weights as a fault-free run.

The memory tier's replication (test_node_lost_restores_from_the_buddys_memory): each node's
snapshots are copied into the other node's memory; a node lost with its memory comes back and
restores from that copy, not from the disk; with FSDP2 (examples/train_fsdp.py) each rank's copy
holds its shards, and the lost node's rank fetches those back.

Needs root, iproute2 (`ip netns`) and util-linux `unshare`; skipped with the reason otherwise. CI
runs as root.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from resctl.checkpoint.memdir import SHM_ENV
from resctl.telemetry.goodput import analyze
from tests.integration.jobs import (
    EXAMPLES,
    LOCAL_PROFILE,
    SNAPSHOT_SCRIPT,
    assert_same_weights,
    events,
    finish,
    last_step,
    start,
    wait_for,
)
from tests.integration.netns_cluster import lose_namespace, signal_namespace
from tests.integration.test_recovery import assert_same_final

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
            signal_namespace(ns, signal.SIGKILL)
            _ip("netns", "del", ns)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


def start_node(ns: str, index: int, tmp_path: Path, job: list[str] | None = None) -> subprocess.Popen[str]:
    """A pod: its own network, hostname <job>-<index>, its own /dev/shm (a private tmpfs in its own
    mount namespace: it vanishes with the node's last process, as a lost node's memory does), and
    the Indexed Job's environment. `job`: what follows `resctl run` (default: the snapshot job)."""
    job = job if job is not None else [
        "-p", str(LOCAL_PROFILE), "--set", f'launch.run_dir="{tmp_path}/runs/{{run_id}}"',
        SNAPSHOT_SCRIPT, "--steps", "40", "--step-time", "0.05",
        "--snapshot", str(tmp_path / "snapshot.pt"), "--out", str(tmp_path / "final.pt")]
    resctl = [sys.executable, "-m", "resctl", "run", "--nnodes", "2", "--nproc-per-node", "1",
              "--set", f'launch.k8s_service="{SERVICE}"', "--set", "launch.rdzv_port=29531", *job]
    inner = (f"mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm && hostname {JOB}-{index} && exec "
             + " ".join(f"'{a}'" for a in resctl))
    env = {**os.environ, "JOB_COMPLETION_INDEX": str(index), "POD_NAMESPACE": NAMESPACE,
           "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop(SHM_ENV, None)
    return subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "sh", "-c", inner],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def first_rank_on(ev: list[dict], index: int) -> int:
    """The group rank node `index` (hostname <job>-<index>) ran first: the rendezvous gives ranks in
    arrival order, not by the Job's completion index (torch's does too), so either node may be rank 0."""
    return next(e["rank"] for e in ev if e["kind"] == "start" and e.get("host") == f"{JOB}-{index}")


def _run_until(nodes: list[str], procs: list[subprocess.Popen[str]], run_dir: Path, step: int) -> None:
    try:
        wait_for(lambda: last_step(run_dir, 1) >= step, 180, f"rank 1 to reach step {step}", procs[0])
    except AssertionError as err:
        for ns in nodes:
            lose_namespace(ns)
        tails = [f"--- node {i} ---\n{(p.communicate(timeout=30)[0] or '')[-3000:]}" for i, p in enumerate(procs)]
        raise AssertionError(f"{err}\n" + "\n".join(tails)) from None


#: The memory-tier jobs (`memory_job`): script, its arguments, extra profile keys, its last step, the step to lose
#: a node at. train_fsdp.py: 128 samples, batch 8, 2 ranks, 3 epochs; its loader resumes mid-epoch (data position).
MEMORY_JOBS = {
    "plain": ("train_ckpt.py", ("--steps", "40", "--step-time", "0.05"), (), 40, 15),
    "fsdp2": ("train_fsdp.py", ("--step-time", "0.1"), ("checkpoint.data_position=true",), 24, 10),
}


def memory_job(tmp_path: Path, name: str, memory_every: int, kind: str = "plain") -> list[str]:
    """A `MEMORY_JOBS` script with the memory tier every `memory_every` steps and the disk every 50 (never, in
    its steps)."""
    script, script_args, sets, _, _ = MEMORY_JOBS[kind]
    args = ["-p", str(LOCAL_PROFILE), "--set", f'launch.run_dir="{tmp_path}/{name}"']
    for item in (f'checkpoint.dir="{tmp_path}/{name}-ckpt"', "checkpoint.interval_steps=50",
                 f"checkpoint.memory_every={memory_every}", "heartbeat.timeout=4s", "heartbeat.check_interval=1s",
                 *sets):
        args += ["--set", item]
    return [*args, str(EXAMPLES / script), *script_args, "--out", str(tmp_path / f"{name}.pt")]


def _freeze_with_the_replica_caught_up(nodes: list[str], run_dir: Path, tries: int = 100) -> None:
    """Stop both nodes at a moment when node a holds node b's rank's copy of a step that node a's rank
    still has in its own two slots: node b's last replicated step at least node a's last snapshot.
    The copy is sent in the background; a node lost while its newest copy is still on the wire, with
    the other node's rank already two snapshots on, shares no step and restores from the disk (the
    documented limit, docs/checkpoint.md). Which of the two a kill meets is timing: this test is
    about the buddy restore, so it picks its moment instead of a clock's."""
    for _ in range(tries):
        for ns in nodes:
            signal_namespace(ns, signal.SIGSTOP)
        ev = events(run_dir)
        b = first_rank_on(ev, 1)
        replicated = max((e["step"] for e in ev if e["kind"] == "ckpt_replica" and e["rank"] == b), default=-1)
        snapped = max((e["step"] for e in ev if e["kind"] == "ckpt_mem" and e["rank"] == 1 - b), default=0)
        if replicated >= snapped:
            return
        for ns in nodes:
            signal_namespace(ns, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError(f"node b's replica never caught up with node a's snapshots in {tries} looks")


# fsdp2's subject is the sharded memory tier (resctl's own code, the same on every NVRx: CI's 0.7.0 pass leaves it
# out); the node loss and the buddy fetch it goes through run on both versions in the plain case.
@pytest.mark.parametrize("kind", [pytest.param(k, marks=[pytest.mark.nvrx_independent] if k == "fsdp2" else [])
                                  for k in MEMORY_JOBS])
def test_node_lost_restores_from_the_buddys_memory(nodes: list[str], tmp_path: Path, kind: str) -> None:
    """memory_every = 1, disk every 50 steps: node b is lost at step ~15 (FSDP2: ~10) with every process
    and its /dev/shm, and comes back empty. Node b's rank restores from node a's copy of its snapshot (tier
    buddy; FSDP2: its shards of the model and AdamW), node a's from its own memory, both the same step, at
    most one step back; the job ends bitwise equal to a fault-free run."""
    _, _, _, last, lose_at = MEMORY_JOBS[kind]
    ref = start(["--nproc-per-node", "2", *memory_job(tmp_path, "ref", 0, kind)], cwd=tmp_path)
    code, out = finish(ref)
    assert code == 0, out[-3000:]
    job = memory_job(tmp_path, "lost", 1, kind)
    procs = [start_node(nodes[0], 0, tmp_path, job), start_node(nodes[1], 1, tmp_path, job)]
    run_dir = tmp_path / "lost"
    _run_until(nodes, procs, run_dir, lose_at)
    _freeze_with_the_replica_caught_up(nodes, run_dir)
    lose_namespace(nodes[1])
    signal_namespace(nodes[0], signal.SIGCONT)
    procs[1].wait(timeout=30)
    procs[1] = start_node(nodes[1], 1, tmp_path, job)  # the Job recreates the pod: new node, empty memory
    (code_a, out_a), (code_b, out_b) = finish(procs[0]), finish(procs[1])
    assert code_a == 0 and code_b == 0, out_a[-3000:] + "\n---\n" + out_b[-3000:]
    ev = events(run_dir)
    replicated = {e["rank"] for e in ev if e["kind"] == "ckpt_replica"}
    assert replicated == {0, 1}, "each node's snapshots were copied to the other"
    loads = {e["rank"]: e for e in ev if e["kind"] == "ckpt_load"}  # the only load of each rank: the resume
    lost = first_rank_on(ev, 1)
    assert loads[lost]["tier"] == "buddy" and loads[1 - lost]["tier"] == "memory", loads
    assert loads[0]["step"] == loads[1]["step"], loads
    (recovery,) = analyze(ev).recoveries
    assert "buddy" in (recovery.tier or "").split("+"), recovery
    assert recovery.rollback_steps is not None and recovery.rollback_steps <= 1, recovery
    assert all(int(p.name.split("-")[1]) == last for p in (tmp_path / "lost-ckpt").glob("step-*")), \
        f"no disk checkpoint before {last}"
    report = subprocess.run([sys.executable, "-m", "resctl", "report", str(run_dir)], capture_output=True, text=True)
    assert "(buddy" in report.stdout + report.stderr, report.stdout[-3000:]
    assert_same_final(tmp_path / "lost.pt", tmp_path / "ref.pt")


def test_node_loss_and_return(nodes: list[str], tmp_path: Path, reference: Path) -> None:
    a = start_node(nodes[0], 0, tmp_path)
    b = start_node(nodes[1], 1, tmp_path)
    run_dir = tmp_path / "runs" / JOB
    try:
        wait_for(lambda: last_step(run_dir, 1) >= 15, 180, "rank 1 to reach step 15", a)
    except AssertionError as err:
        for ns in nodes:
            lose_namespace(ns)
        tails = [f"--- node {i} ---\n{(p.communicate(timeout=30)[0] or '')[-3000:]}" for i, p in enumerate((a, b))]
        raise AssertionError(f"{err}\n" + "\n".join(tails)) from None
    lose_namespace(nodes[1])
    b.wait(timeout=30)
    b_again = start_node(nodes[1], 1, tmp_path)  # the Job recreates the pod with the same index
    code_a, out_a = finish(a)
    code_b, out_b = finish(b_again)
    assert code_a == 0, out_a[-4000:]
    assert code_b == 0, out_b[-4000:]
    assert "resumed from" in out_a
    starts = [e for e in events(run_dir) if e["kind"] == "start"]
    assert {e["rank"] for e in starts} == {0, 1}
    assert max(e["cycle"] for e in starts if e["host"] == f"{JOB}-0") >= 1, "node a restarted its worker in-job"
    assert_same_weights(tmp_path / "final.pt", reference)
