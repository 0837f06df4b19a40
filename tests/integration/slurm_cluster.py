"""A real two-node Slurm cluster on this host, for tests of examples/slurm/.

Debian's packages (slurmctld, slurmd, slurm-client, munge; `.ci/run` installs them): one munged on
a private socket and key, one slurmctld, and two slurmd started as nodes ``n1`` and ``n2``
(``slurmd -N``), both at 127.0.0.1 on their own ports. Everything lives in one temporary
directory; the daemons are stopped by their pid files. The node names must resolve (resctl
puts the rendezvous on the first host of the nodelist, as on a real cluster), so when ``n1`` does
not resolve a marked line is added to /etc/hosts and removed again on stop.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_port

NODES = ("n1", "n2")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "sinfo")
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# resctl-test-slurm"
HOSTS_LOCK = Path(tempfile.gettempdir()) / "resctl-test-slurm-hosts.lock"

SLURM_CONF = """\
ClusterName=resctltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket{auth_extra}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
KillWait=30
MinJobAge=600
{extra}{nodes}
PartitionName=debug Nodes={nodelist} Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
    """Why this host cannot run the cluster, or None when it can."""
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return (f"Slurm/munge binaries not installed ({', '.join(absent)}); "
                "apt-get install -y slurmctld slurmd slurm-client munge (.ci/run does)")
    if os.geteuid() != 0:
        return "slurmd must run as root to start job steps; run the Slurm tests as root"
    return None


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
        return True
    except OSError:
        return False


@dataclass
class SlurmCluster:
    """Handle on a running test cluster; `env` is what a Slurm client command needs."""

    dir: Path
    env: dict[str, str] = field(default_factory=dict)
    hosts_line: str = ""  # the line this cluster added to /etc/hosts ("": none)
    requeue_delay: int | None = None  # None: Slurm's own (121 s)

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, Reason, ExitCode, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id)
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted((self.dir / "log").glob("*")))

    # --- lifecycle ------------------------------------------------------------------------------

    @classmethod
    def start(cls, requeue_delay: int | None = None) -> SlurmCluster:
        """`requeue_delay`: seconds a requeued job is held before it may start again (Slurm's credential
        lifetime, AuthInfo cred_expire, + 1; 121 s by default), and the main scheduling loop every 2 s instead
        of 60 s, so a job that becomes eligible starts at once."""
        root = Path(tempfile.mkdtemp(prefix="resctl-slurm-", dir="/tmp"))
        cluster = cls(root, requeue_delay=requeue_delay)
        try:
            cluster._start()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start(self) -> None:
        d = self.dir
        d.chmod(0o755)  # munged wants its socket directory reachable by everyone
        for sub in ("state", "log", "munge", *(f"spool/{n}" for n in NODES)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        self._write_conf()
        self.env = {**os.environ, "SLURM_CONF": str(d / "slurm.conf")}
        self._ensure_hosts()
        self._start_munge()
        self.run("slurmctld", "-f", str(d / "slurm.conf"), "-i")
        for node in NODES:
            self.run("slurmd", "-f", str(d / "slurm.conf"), "-N", node)
        self.wait_idle(60)

    def _write_conf(self) -> None:
        lines = [f"NodeName={n} NodeAddr=127.0.0.1 Port={free_port()} CPUs={max(os.cpu_count() or 1, 1)} State=UNKNOWN"
                 for n in NODES]
        quick = self.requeue_delay is not None
        (self.dir / "slurm.conf").write_text(SLURM_CONF.format(
            host=socket.gethostname(), ctld_port=free_port(), dir=self.dir, nodes="\n".join(lines),
            nodelist=",".join(NODES), auth_extra=f",cred_expire={self.requeue_delay - 1}" if quick else "",
            extra="SchedulerParameters=sched_interval=2\n" if quick else ""))

    def _ensure_hosts(self) -> None:
        with _hosts_lock():
            if HOSTS_MARK not in HOSTS_FILE.read_text() and all(_resolves(n) for n in NODES):
                return  # the machine's own names for them
            self.hosts_line = f"127.0.0.1 {' '.join(NODES)} {HOSTS_MARK} {self.dir.name}\n"
            with HOSTS_FILE.open("a") as f:
                f.write(self.hosts_line)

    def _drop_hosts_line(self) -> None:
        if not self.hosts_line:
            return
        with _hosts_lock():
            lines = HOSTS_FILE.read_text().splitlines(keepends=True)
            HOSTS_FILE.write_text("".join(line for line in lines if line != self.hosts_line))
        self.hosts_line = ""

    def _start_munge(self) -> None:
        m = self.dir / "munge"
        key = m / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        argv = ["munged", f"--key-file={key}", f"--socket={m}/munge.socket", f"--pid-file={m}/munged.pid",
                f"--log-file={m}/munged.log", f"--seed-file={m}/munged.seed"]
        try:
            import pwd

            user = pwd.getpwnam("munge")
            for path in (m, key):
                os.chown(path, user.pw_uid, user.pw_gid)
            m.chmod(0o711)
            argv = ["runuser", "-u", "munge", "--", *argv]
        except KeyError:
            argv.append("--force")  # no munge user: run it as root
        self.run(*argv)

    def wait_idle(self, timeout: float) -> None:
        """Until both nodes are idle: no job on them, none still completing."""
        deadline = time.monotonic() + timeout
        out = ""
        while time.monotonic() < deadline:
            out = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False)
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in NODES):
                return
            time.sleep(0.5)
        raise RuntimeError(f"slurm nodes not idle after {timeout}s: {out!r}\n{self.logs()}")

    def stop(self) -> None:
        if self.env:
            self.run("scancel", "--user=root", check=False)
            deadline = time.monotonic() + 45  # KillWait (30 s) and a margin: no job step outlives the test
            while time.monotonic() < deadline and self.run("squeue", "--noheader", "--states=R,CG", check=False).strip():
                time.sleep(0.5)
        pids = [self.dir / "slurmd-n1.pid", self.dir / "slurmd-n2.pid", self.dir / "slurmctld.pid",
                self.dir / "munge" / "munged.pid"]
        for pidfile in pids:
            _stop_pid(pidfile)
        self._drop_hosts_line()
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def _hosts_lock() -> Iterator[None]:
    """Held while /etc/hosts is read and changed by a test cluster of any process on this machine."""
    with open(HOSTS_LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stop_pid(pidfile: Path, timeout: float = 15) -> None:
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
