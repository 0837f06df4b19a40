"""N "nodes" as network namespaces joined by a bridge in a switch namespace of their own (nothing is added to
the host's network), each with an address 10.<net>.0.<i+1>. Helpers to slow one node's link (`tc tbf`: this
kernel has no netem) or its CPU (a cgroup v1 CPU quota), and to lose a node: its processes killed (`lose`:
the kernel closes their sockets, so every peer gets a FIN or RST at once) or its machine gone (`lose_machine`:
frozen, unplugged, then killed, so nothing it would send on the way out reaches anyone and its peers learn of
the loss only from their own timeouts, as when a machine powers off). Needs root, iproute2 and tc."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


def signal_namespace(ns: str, *sigs: signal.Signals) -> None:
    """Every process in namespace `ns` (listed once) gets each of `sigs`, in order."""
    pids = [int(pid) for pid in _ip("netns", "pids", ns).stdout.split()]
    for sig in sigs:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def lose_namespace(ns: str) -> None:
    """A node gone whole, as when the machine goes: every process in namespace `ns` stopped first (none
    reacts to a parent's death, e.g. a lifeline's SIGTERM, before its own SIGKILL lands), then killed."""
    signal_namespace(ns, signal.SIGSTOP, signal.SIGKILL)


def unavailable() -> str | None:
    """Why this host cannot make the namespaces (None: it can)."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs root, iproute2 and tc to create network namespaces"
    return None


class Cluster:
    def __init__(self, tag: str, n: int) -> None:
        self.tag, self.n = tag, n
        self.names = [f"rc{tag}{i}" for i in range(n)]
        self.switch = f"rc{tag}sw"
        net = int(tag[:2], 16)
        self.addrs = [f"10.214.{net}.{i + 1}" for i in range(n)]
        self.cgroups: list[Path] = []

    def dev(self, i: int) -> str:
        return f"v{self.tag}{i}"

    def exec_prefix(self, i: int) -> list[str]:
        return ["ip", "netns", "exec", self.names[i]]

    def slow_link(self, i: int, rate: str = "80mbit") -> None:
        """Egress of node i limited to `rate` (token bucket)."""
        out = subprocess.run([*self.exec_prefix(i), "tc", "qdisc", "replace", "dev", self.dev(i), "root", "tbf",
                              "rate", rate, "burst", "64kb", "latency", "100ms"], capture_output=True, text=True)
        if out.returncode != 0:
            pytest.skip(f"tc tbf not available: {out.stderr.strip()}")

    def slow_cpu(self, pid: int, quota: float = 0.15) -> None:
        """Put process `pid` (and what it starts later) in a cgroup limited to `quota` of one CPU. From
        outside: `ip netns exec` mounts its own /sys, without the cgroup tree."""
        base = Path("/sys/fs/cgroup/cpu")
        if not (base / "cpu.cfs_quota_us").exists():
            pytest.skip("no cgroup v1 cpu controller to slow a node's CPU")
        group = base / f"rc{self.tag}slow"
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(max(1000, int(100000 * quota))))
        self.cgroups.append(group)
        (group / "cgroup.procs").write_text(str(pid))  # every thread of it, and what it starts later

    def unslow_cpu(self) -> None:
        """Lift the quotas of slow_cpu (the processes stay in their groups)."""
        for group in self.cgroups:
            (group / "cpu.cfs_quota_us").write_text("-1")

    def cpu_stat(self) -> str:
        """The slowed cgroups' cpu.stat (nr_throttled > 0: the quota held), for failure messages."""
        return "; ".join(" ".join((g / "cpu.stat").read_text().split()) for g in self.cgroups if (g / "cpu.stat").exists())

    def connected(self, i: int, port: int) -> list[int]:
        """PIDs of node i's processes with an established TCP connection to `port` (from /proc)."""
        inodes: set[str] = set()
        pids = [int(p) for p in _ip("netns", "pids", self.names[i]).stdout.split()]
        for pid in pids[:1]:
            try:
                lines = [line for name in ("tcp", "tcp6")
                         for line in Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]]
            except OSError:
                return []
            for line in lines:
                f = line.split()
                if f[3] == "01" and int(f[2].split(":")[1], 16) == port:  # ESTABLISHED, remote port
                    inodes.add(f[9])
        out = []
        for pid in pids:
            try:
                fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            except OSError:
                continue
            if any(fd.startswith("socket:[") and fd[8:-1] in inodes for fd in fds):
                out.append(pid)
        return out

    def lose(self, i: int) -> None:
        lose_namespace(self.names[i])

    def lose_machine(self, i: int) -> None:
        """Node i's machine gone: every process frozen, its link removed (the veth pair), then every process
        killed: their FINs and RSTs have no way out, and the other nodes' connections to it stay open, unanswered."""
        signal_namespace(self.names[i], signal.SIGSTOP)
        assert _ip("-n", self.switch, "link", "del", f"s{self.tag}{i}").returncode == 0
        signal_namespace(self.names[i], signal.SIGKILL)

    def kill(self, i: int) -> None:
        signal_namespace(self.names[i], signal.SIGKILL)


@contextmanager
def cluster(n: int) -> Iterator[Cluster]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    c = Cluster(uuid.uuid4().hex[:5], n)
    if _ip("netns", "add", c.switch).returncode != 0:
        pytest.skip("cannot create network namespaces here")
    try:
        _ip("-n", c.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", c.switch, "link", "set", "br0", "up")
        for i, ns in enumerate(c.names):
            _ip("netns", "add", ns)
            peer = f"s{c.tag}{i}"
            assert _ip("link", "add", c.dev(i), "type", "veth", "peer", "name", peer).returncode == 0
            _ip("link", "set", c.dev(i), "netns", ns)
            _ip("link", "set", peer, "netns", c.switch)
            _ip("-n", c.switch, "link", "set", peer, "master", "br0")
            _ip("-n", c.switch, "link", "set", peer, "up")
            _ip("-n", ns, "addr", "add", f"{c.addrs[i]}/24", "dev", c.dev(i))
            _ip("-n", ns, "link", "set", c.dev(i), "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield c
    finally:
        for i in range(n):
            c.kill(i)
            _ip("netns", "del", c.names[i])
        _ip("netns", "del", c.switch)
        for group in c.cgroups:  # empty once the killed processes are reaped, which may take a moment
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
