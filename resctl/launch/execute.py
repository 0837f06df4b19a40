"""The one place that starts the launcher.

resctl runs ft_launcher as a child rather than exec'ing it, so that it can forward signals
(SIGTERM/SIGINT/SIGUSR1/SIGUSR2) to the launcher's process group leader, pass its exit code
through, and print a one-screen summary of what failed when it fails. A stop is bounded: what is
left `launch.term_timeout` (+ `EXIT_SLACK`) after it is SIGKILLed, the whole tree. The launcher dies
with this process (`resctl.launch.lifeline`), so a SIGKILLed `resctl run` leaves no job behind.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from resctl.checkpoint import memdir, replica
from resctl.errors import LaunchError, UsageError
from resctl.health.watch import Watch
from resctl.launch import leftovers, lifeline, prestart, rendezvous, stop
from resctl.launch.owned_rdzv import mark_launcher_gone
from resctl.launch.plan import LAUNCHER_ENTRY, PLAN_FILE, LaunchPlan, Target, plan, restart_policy
from resctl.launch.rdzv_rounds import IMPL_ENV
from resctl.profile import contract
from resctl.profile.load import Layer, Resolved, resolve
from resctl.profile.nvrx_versions import series_for
from resctl.telemetry.metrics import serve
from resctl.telemetry.summary import failure_summary

if TYPE_CHECKING:
    from resctl.checkpoint.replica import ReplicaServer
    from resctl.health.watch import Watch

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def installed_nvrx() -> str:
    try:
        return metadata.version("nvidia-resiliency-ext")
    except metadata.PackageNotFoundError:
        raise LaunchError(
            "nvidia-resiliency-ext is not installed in this Python; install it with "
            "`pip install nvidia-resiliency-ext` (0.4.1 on glibc < 2.39)"
        ) from None


def nvrx_version(resolved: Resolved) -> str:
    """The NVRx version the plan is for, checked against the profile (what `profile validate` runs too)."""
    launch = resolved.profile.launch
    version = installed_nvrx() if launch.nvrx_version == "auto" else launch.nvrx_version
    restart_policy(resolved, version)
    if resolved.profile.inprocess.enabled:
        inprocess_available(resolved, version)
    return version


def inprocess_available(resolved: Resolved, version: str, find: Callable[[str], Any] | None = None) -> None:
    """In-process restart is NVRx's `inprocess` package, which NVRx deprecated in 0.6 in favour of in-job
    restart. resctl drives it on NVRx 0.4 only (docs/recovery.md: on 0.7.0 its restart health checks fail
    on this path and every fault ends in a launcher restart); on other versions, or one without the
    package, it is refused before launch, naming the alternative.

    Raises:
        UsageError: inprocess.enabled = true and the NVRx version cannot give resctl's in-process restart.
    """
    try:
        found = (find or find_spec)("nvidia_resiliency_ext.inprocess")
    except (ImportError, ValueError):
        found = None
    why = ("has no in-process restart (nvidia_resiliency_ext.inprocess)" if found is None
           else "deprecated in-process restart (0.6), and resctl drives it on NVRx 0.4.x only"
           if series_for(version) != "0.4" else "")
    if why:
        raise UsageError(
            f"inprocess.enabled = true ({resolved.source('inprocess.enabled')}): NVRx {version} {why}. Set "
            "inprocess.enabled = false: ft_launcher's in-job restart recovers every fault then (an exception, "
            "a hang or a dead worker restarts the workers; forked workers resume in well under a second on CPU, "
            "docs/recovery.md), or install NVRx 0.4.1 for in-process restart."
        )


def prepare(profile: Path | None, flags: Layer, sets: Sequence[str], target: Target) -> tuple[Resolved, LaunchPlan]:
    """Resolve the profile, find the rendezvous and plan the launcher command."""
    resolved = resolve(profile, flags=flags, sets=sets)
    launch = resolved.profile.launch
    version = nvrx_version(resolved)
    rdzv = rendezvous.detect(launch, os.environ, socket.gethostname())
    return resolved, plan(resolved, target, rdzv, version, user_env=os.environ, cwd=Path.cwd())


def launcher_program() -> list[str]:
    # The same interpreter as resctl, so the workers see the same packages; ft_entry runs NVRx's
    # launcher after the version adapters it needs.
    return [sys.executable, "-m", LAUNCHER_ENTRY]


def _key_for(launch_plan: LaunchPlan, path: Path) -> str:
    key = "launch.run_dir" if path == launch_plan.run_dir or launch_plan.run_dir in path.parents else "launch.log_dir"
    return f"{key} ({launch_plan.origins.get(key, 'default')})"


def write_files(launch_plan: LaunchPlan) -> None:
    """Create the run directory (private: 0700) and write the plan's files (0600) into it.

    Raises:
        UsageError: a directory cannot be created (a file is in the way, no permission, read-only).
    """
    # Every node of a job writes the same files into a shared run directory (FSx): the temporary
    # name is per process so two nodes never rename each other's file away.
    for directory in launch_plan.dirs:
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as err:
            blocker = next((p for p in (directory, *directory.parents) if p.exists() and not p.is_dir()), None)
            why = f"{blocker} is a file, not a directory" if blocker else (err.strerror or str(err))
            raise UsageError(f"{_key_for(launch_plan, directory)} = {directory}: cannot create it: {why}; "
                             "give a directory that resctl can create and write (flag --run-dir / --log-dir)") from None
    for path, text in launch_plan.files.items():
        tmp = path.with_name(f"{path.name}.tmp.{socket.gethostname()}.{os.getpid()}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
        except OSError as err:
            raise UsageError(f"{_key_for(launch_plan, path)}: cannot write {path}: {err.strerror or err}; "
                             "give a run directory resctl can write") from None


def serve_metrics(launch_plan: LaunchPlan) -> str:
    """Start the metrics endpoint; returns HOST:PORT it really listens on (port 0 becomes the bound port)."""
    assert launch_plan.metrics_port is not None
    plan_data = json.loads(launch_plan.files[launch_plan.run_dir / PLAN_FILE])
    try:
        server = serve(launch_plan.run_dir, launch_plan.metrics_port, addr=launch_plan.metrics_addr, plan=plan_data)
    except OSError as err:
        port, addr = launch_plan.metrics_port, launch_plan.metrics_addr
        raise UsageError(
            f"launch.metrics_port ({launch_plan.origins.get('launch.metrics_port', 'default')}) = {port}: cannot "
            f"listen on {addr}:{port}: {err.strerror or err}; pick a free port (--metrics-port), 0 for any free "
            "port, or check launch.metrics_addr"
        ) from None
    host = launch_plan.metrics_addr
    return f"[{host}]:{server.server_port}" if ":" in host else f"{host}:{server.server_port}"


def serve_replica(launch_plan: LaunchPlan, env: dict[str, str], on_event: Callable[[str], None],
                  launch: str = "") -> "ReplicaServer | None":
    """Start this node's memory-tier replica server when the plan replicates (the workers find it in
    `RESCTL_REPLICA_ADDR`, added to `env`); it lives as long as this process, across worker restarts.
    `launch`: this launch's memory-tree suffix (`memdir.new_launch`)."""
    if launch_plan.replica_port is None:
        return None
    key = memdir.job_key(launch_plan.run_id, "")
    try:
        server = replica.ReplicaServer(key, launch_plan.replica_port, launch=launch)
    except OSError as err:
        raise UsageError(
            f"checkpoint.memory_replicate_port = {launch_plan.replica_port}: cannot listen on it: "
            f"{err.strerror or err}; pick a free port, 0 for any free port, or set checkpoint.memory_replicate = false"
        ) from None
    host = replica.advertised_host(launch_plan.rendezvous.endpoint)
    if not host:
        server.close()
        on_event(f"resctl: memory-tier replication off on this node: no address other nodes can reach (only "
                 f"loopback found); set {replica.HOST_ENV} to this node's address")
        return None
    env[replica.ADDR_ENV] = server.address(host)  # with its secret: for this job's workers only
    if os.environ.get(contract.VERBOSE) == "1":
        on_event(f"resctl: memory replica server on {replica.format_addr(host, server.port)}")
    return server


def exit_code(code: int, received: Sequence[int]) -> int:
    """What `resctl run` exits with: the launcher's code, or 128+N when signal N stopped the job.

    ft_launcher itself exits 1 after a SIGTERM; Kubernetes, Slurm and shells expect 143 (128+15),
    also when the launcher had to be killed after `launch.term_timeout`. A stopped job never reports
    success, even when its workers exited 0 (torchrun exits 1 then): an Indexed Job must not count a
    preempted index as completed.
    """
    stops = [s for s in received if s in (signal.SIGTERM, signal.SIGINT)]
    if stops:
        return 128 + int(stops[0])
    if code < 0:  # the launcher itself died of a signal: report it the way a shell would
        return 128 - code
    return code


#: After a forwarded stop, how long past launch.term_timeout the launcher may take to exit (its own
#: SIGKILL of the workers comes at term_timeout; this is for its exit after that).
EXIT_SLACK = 5.0


def wait_stopping(child: "subprocess.Popen[bytes]", received: Sequence[int], term_timeout: float,
                  on_event: Callable[[str], None]) -> int:
    """Wait for the launcher; once a stop was forwarded, SIGKILL its whole process tree if it is
    still there `term_timeout` + `EXIT_SLACK` seconds later (a stop is never held up for good)."""
    deadline: float | None = None
    exited = _exit_waiter(child)
    while True:
        try:
            return exited(0.2 if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        if deadline is None:
            if any(s in (signal.SIGTERM, signal.SIGINT) for s in received):
                deadline = time.monotonic() + term_timeout + EXIT_SLACK
            continue
        if time.monotonic() >= deadline:
            killed = kill_tree(child.pid)
            on_event(f"resctl: the launcher had not stopped {term_timeout + EXIT_SLACK:g} s after the stop "
                     f"(launch.term_timeout = {term_timeout:g}s): killed it and {killed - 1} more processes")
            return child.wait()


def _exit_waiter(child: "subprocess.Popen[bytes]") -> Callable[[float], int]:
    """`child.wait(timeout)`, woken the moment the child exits where Linux gives a pidfd (`Popen.wait` with a
    timeout polls, up to 50 ms apart: that much of a short job's end)."""
    try:
        fd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        return lambda timeout: child.wait(timeout=timeout)

    def wait(timeout: float) -> int:
        if child.returncode is None and not select.select([fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(child.args, timeout)
        code = child.wait()
        os.close(fd)
        return code

    return wait


def kill_tree(pid: int) -> int:
    """SIGKILL `pid` and every process below it (workers lead their own process groups); returns
    how many were signalled."""
    import psutil

    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    for proc in tree:
        try:
            proc.kill()
        except psutil.Error:
            pass
    return len(tree)


def run(launch_plan: LaunchPlan, on_event: Callable[[str], None] = print) -> int:
    """Start ft_launcher, forward signals, return its exit code (printing a summary on failure)."""
    started = time.monotonic()
    write_files(launch_plan)
    (launch_plan.run_dir / stop.FATAL_FILE).unlink(missing_ok=True)  # a reason is this run's only
    _notes(launch_plan, on_event)
    on_event(f"resctl: run {launch_plan.run_id} -> {launch_plan.run_dir}")
    if launch_plan.metrics_port is not None:
        on_event(f"resctl: metrics on http://{serve_metrics(launch_plan)}/metrics")
    # This launch's own memory-tier tree: another job with the same run id on this node has its own.
    launch = memdir.new_launch()
    memdir.sweep_dead_launches(launch_plan.run_id)
    env = {**os.environ, **launch_plan.env, lifeline.RUN_PID_ENV: str(os.getpid()), memdir.LAUNCH_ENV: launch}
    replica_server = serve_replica(launch_plan, env, on_event, launch)
    received: list[int] = []
    children: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for child in children:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    # Handlers go in before the launcher starts: a signal in between must not orphan it.
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        # Its own process group: a Ctrl-C (SIGINT to the terminal's foreground group) reaches only
        # `resctl run`, which forwards it once. In resctl's group the launcher got it twice (the
        # terminal's and the forwarded one): the second landed while it was SIGINTing the workers, and
        # it SIGTERMed them instead, before their `except KeyboardInterrupt:` cleanup ran.
        child = (prestart.hand_over(launcher_program(), launch_plan.args, env)
                 or subprocess.Popen(launcher_program() + launch_plan.args, env=env, **prestart.OWN_GROUP))
        children.append(child)
        for signum in received:  # arrived while the launcher was starting
            child.send_signal(signum)
        watch = _watch(launch_plan, child.pid, on_event)
        launcher_code = wait_stopping(child, received, launch_plan.term_timeout, on_event)
        _after_launcher(launch_plan, child.pid, launcher_code)
        if watch is not None:
            watch.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if replica_server is not None:
            replica_server.close()
    code = exit_code(launcher_code, received)
    memdir.release_job(launch_plan.run_id, launch=launch)  # backstop: memory-tier snapshots this node's workers left
    fatal = stop.read_fatal(launch_plan.run_dir) if code != 0 else None
    if fatal is not None:
        who = f"rank {fatal.get('rank')}" if "cause" not in fatal else f"resctl ({fatal['cause']})"
        on_event(f"resctl: {who} stopped the job (no restart can cure it): {fatal.get('error')}")
        on_event(f"resctl: exit {fatal['exit_code']}; run dir {launch_plan.run_dir}")
        return int(fatal["exit_code"])
    if code != 0 and received:
        names = ", ".join(sorted({signal.Signals(s).name for s in received}))
        on_event(f"resctl: stopped by {names} (forwarded to ft_launcher, which exited {launcher_code}); "
                 f"exit {code}; run dir {launch_plan.run_dir}")
    elif code == 128 + signal.SIGTERM:  # the launcher stopped the job without a signal here: another node's stop
        on_event(f"resctl: stopped with the job (a SIGTERM that reached another node or the launcher itself); "
                 f"exit {code}; run dir {launch_plan.run_dir}")
    elif code != 0:
        for line in failure_summary(launch_plan.run_dir, code):
            on_event(line)
    else:
        on_event(f"resctl: finished in {time.monotonic() - started:.1f} s (exit 0); `resctl report "
                 f"{launch_plan.run_dir}` for details")
    return code


def _after_launcher(launch_plan: LaunchPlan, pid: int, code: int) -> None:
    """A launcher killed by a signal cannot clean up or say it left: remove what it left on the node
    (resctl.launch.leftovers) and, on resctl's rendezvous, say it left for it."""
    if code < 0:
        leftovers.remove_for(pid)

    if launch_plan.env.get(IMPL_ENV) == "resctl":
        mark_launcher_gone(launch_plan.run_dir, pid, launch_plan.rendezvous.endpoint, launch_plan.run_id, code)


def _watch(launch_plan: LaunchPlan, launcher_pid: int, on_event: Callable[[str], None]) -> "Watch | None":
    """The straggler watch over this run's events (resctl.health.watch), when the profile asks for one."""
    if launch_plan.health is None:
        return None
    watch = Watch(launch_plan.run_dir, launch_plan.health, on_event)
    if not watch.needed:
        return None
    watch.start(launcher_pid)
    return watch


def _notes(launch_plan: LaunchPlan, on_event: Callable[[str], None]) -> None:
    """How the plan was made (rendezvous, run id): into the run directory's launcher.log, and on the
    console only with -v (RESCTL_VERBOSE=1); a fault drill is always said."""
    from resctl.launch.launcher_logs import LOG_FILE

    verbose = os.environ.get(contract.VERBOSE) == "1"
    with open(launch_plan.run_dir / LOG_FILE, "a", encoding="utf-8") as log:
        for note in launch_plan.notes:
            log.write(f"resctl: {note}\n")
            if verbose or "FAULT DRILL" in note:
                on_event(f"resctl: {note}")
