"""`python -m resctl.launch.ft_entry ARGS`: NVRx `ft_launcher` with resctl's adapters applied.

resctl starts the launcher through this module instead of `-m nvidia_resiliency_ext...launcher` so
that gaps between an NVRx release and the installed torch, and the launcher's slow paths, can be
bridged without forking NVRx. Every change is an owned, undoable patch (`resctl.patching`), and each
checks for the exact gap it fills:

- `ProcessException.pid`: NVRx 0.4.1's multiprocessing compat reads `.pid`; torch >= 2.6 names it
  `error_pid`. Without the alias a worker killed by a signal under `--start-method fork` crashes the
  launcher instead of restarting the workers.
- `RunResult.is_failed` (0.4/0.5): a group that used up its restarts ends UNHEALTHY with failures,
  which the launcher took for success (exit 0).
- **Quick restart stops.** When a worker dies, torch's `ProcessContext.join` (forked workers, every
  NVRx version) SIGTERMs the others and waits a hard-coded 30 s before SIGKILL; NVRx's
  `_stop_workers` (exec'd workers) waits `--workers-stop-timeout`. A survivor blocked in an NCCL
  or gloo collective never runs a Python SIGTERM handler, so every restart paid the full wait. Both
  paths now first name the stopped PIDs in the restart-stop marker (`resctl.launch.stop`), so the
  shim leaves at once instead of saving, and both wait at most `--workers-stop-timeout`.
- **Titles.** The launcher, each worker and each rank monitor name themselves (`resctl.launch.titles`).
- **Wake on worker exit.** The launcher polls its workers every `--monitor-interval` (5 s, the AWS
  default). Its sleep now also ends when a worker process exits (pidfd), so neither a dead rank nor
  the end of the job waits for the next poll; the interval still paces the other checks.

- **Own process groups, quick leftover cleanup.** NVRx 0.6+ `killpg`s the stopped workers' process
  groups and then sleeps 1 s. Forked workers shared the launcher's group, so on 0.7 the first restart
  SIGTERMed the launcher and `resctl run` themselves. Every process forked from the launcher now leads
  its own group, and the cleanup waits only while a group still has members.
- **Quiet console.** With `RESCTL_RUN_DIR` set and not `RESCTL_VERBOSE=1`, the launcher's log
  lines and warnings and its rank monitors' lines go to `<run_dir>/launcher.log` (the logging
  root handler; the `sys` the rank-monitor module sees); the console keeps the workers' own
  output (the process's stdout and stderr, which workers inherit, are untouched) and one line per
  worker-group restart.

Forked workers inherit the launcher's memory: the patches are undone in every child at fork.
"""

from __future__ import annotations

import logging
import os
import re
import select
import signal
import time
from typing import Any

from resctl.launch import stop
from resctl.patching import Patches

# Imported once in the launcher when workers are forked from it, so no worker pays for them again:
# what every worker imports (torch, the shim), before the first workers start. What a script may
# import later (torch imports torch._dynamo and sympy on the first optimizer it builds: about 1 s;
# FSDP 0.5 s) is imported in a thread once the first workers have run `LATE_AFTER` seconds, or
# before workers are started again if that was sooner: a job's start never waits for them, nor a
# short job's end (the happy path is torchrun's, bench/bench_happy_path.py), and restarted workers
# are forked with them loaded (in-job recovery in well under a second, bench/bench_recovery.py).
PRELOAD = ("torch", "torch.distributed", "torch.optim", "torch.nn", "resctl.shim.runtime", "resctl.checkpoint.engine",
           "nvidia_resiliency_ext.fault_tolerance.rank_monitor_client")
LATE_PRELOAD = ("torch._dynamo", "torch.distributed.fsdp")
LATE_AFTER = 3.0  # seconds the first workers run before LATE_PRELOAD is imported beside them


class _LatePreload:
    """`LATE_PRELOAD`, imported in a thread beside running workers. Every fork of the launcher
    (workers, rank monitors) happens in `_start_workers`, which first waits for the thread (a child
    forked while another thread holds an import lock could deadlock on it) or imports them itself."""

    thread: Any = None
    started_at: float | None = None

    @classmethod
    def enabled(cls) -> bool:
        return os.environ.get("RESCTL_PRELOAD") == "1"

    @classmethod
    def workers_started(cls) -> None:
        import time

        if cls.started_at is None:
            cls.started_at = time.monotonic()

    @classmethod
    def maybe_start(cls) -> None:
        """From the monitor loop: start the thread once the first workers have run long enough."""
        import threading
        import time

        if cls.thread is not None or cls.started_at is None or not cls.enabled():
            return
        if time.monotonic() - cls.started_at >= LATE_AFTER:
            cls.thread = threading.Thread(target=_import, args=(LATE_PRELOAD,), name="resctl-preload", daemon=True)
            cls.thread.start()

    @classmethod
    def before_fork(cls) -> None:
        if cls.thread is not None:
            cls.thread.join()
        elif cls.started_at is not None and cls.enabled():  # a restart came first
            _import(LATE_PRELOAD)


def _import(names: tuple[str, ...]) -> None:
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a worker that needs it imports it (and reports) itself
            continue


PATCHES = Patches("launcher")


class _Agent:
    """The launcher's elastic agent, once it has started workers (for the patches below)."""

    current: Any = None

    @classmethod
    def stop_timeout(cls) -> float | None:
        agent = cls.current
        return None if agent is None else float(getattr(agent, "_workers_stop_timeout", 0) or 0) or None

    @classmethod
    def live_pids(cls) -> list[int]:
        agent = cls.current
        pcontext = getattr(agent, "_pcontext", None)
        if pcontext is None:
            return []
        try:
            return [int(p) for p in pcontext.pids().values()]
        except Exception:  # noqa: BLE001 - a context being torn down
            return []


    @classmethod
    def result_fds(cls) -> list[int]:
        """Read ends of the return-value queues of forked workers that have not reported yet.
        A forked worker that finished puts its result there and then waits for the launcher to
        read it before it exits (torch's `MultiprocessContext`), so its end is seen here first."""
        pcontext = getattr(cls.current, "_pcontext", None)
        queues = getattr(pcontext, "_ret_vals", None) or {}
        done = getattr(pcontext, "_return_values", None) or {}
        fds = []
        for local_rank, queue in queues.items():
            if local_rank in done:
                continue
            try:
                fds.append(queue._reader.fileno())
            except (AttributeError, OSError, ValueError):  # closed, or another queue type
                continue
        return fds


def _stop_file() -> Any:
    from pathlib import Path

    return Path(os.environ[stop.ENV])


def _bridge_versions(patches: Patches) -> None:
    import importlib

    # `torch.multiprocessing.spawn` the attribute is a function; the module has to be looked up.
    spawn = importlib.import_module("torch.multiprocessing.spawn")
    if not hasattr(spawn.ProcessException, "pid"):
        patches.set(spawn.ProcessException, "pid", property(lambda self: self.error_pid))
    try:  # NVRx 0.4/0.5 carry their own copy of torch elastic; 0.6+ use torch's
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api
    except ImportError:
        return
    original = api.RunResult.is_failed

    def is_failed(self: "api.RunResult") -> bool:
        return original(self) or (self.state == api.WorkerState.UNHEALTHY and bool(self.failures))

    patches.set(api.RunResult, "is_failed", is_failed)


def _quick_restart_stops(patches: Patches) -> None:
    import importlib
    import multiprocessing.connection

    spawn = importlib.import_module("torch.multiprocessing.spawn")
    join = spawn.ProcessContext.join

    def quick_join(self: Any, timeout: float | None = None, grace_period: float | None = None) -> Any:
        limit = _Agent.stop_timeout()
        if limit is not None and self.sentinels:
            ready = multiprocessing.connection.wait(list(self.sentinels), timeout=0)
            if any(self.processes[self.sentinels[s]].exitcode not in (0, None) for s in ready):
                survivors = [p for p in self.processes if p.is_alive()]
                stop.mark_restart(_stop_file(), (p.pid for p in survivors))
                for proc in survivors:
                    try:
                        os.kill(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            if grace_period is None:  # torch waits this, SIGTERMs, waits it again, then SIGKILLs
                grace_period = limit / 2
        return join(self, timeout, grace_period)

    patches.set(spawn.ProcessContext, "join", quick_join)

    from nvidia_resiliency_ext.fault_tolerance import launcher

    agent_cls = launcher.LocalElasticAgent
    stop_workers = agent_cls._stop_workers
    start_workers = agent_cls._start_workers

    def marked_stop_workers(self: Any, *args: Any, **kwargs: Any) -> Any:
        stop.mark_restart(_stop_file(), _Agent.live_pids())
        return stop_workers(self, *args, **kwargs)

    def tracked_start_workers(self: Any, *args: Any, **kwargs: Any) -> Any:
        _Agent.current = self
        stop.clear(_stop_file())
        _LatePreload.before_fork()
        started = start_workers(self, *args, **kwargs)
        _LatePreload.workers_started()
        return started

    patches.set(agent_cls, "_stop_workers", marked_stop_workers)
    patches.set(agent_cls, "_start_workers", tracked_start_workers)


class _WakeOnWorkerExit:
    """Stands in for the `time` module inside NVRx's launcher module: `sleep()` also returns when
    a worker that was alive exits. Everything else is the real module."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def sleep(self, seconds: float) -> None:
        _LatePreload.maybe_start()
        fds = []
        for pid in _Agent.live_pids():
            try:
                fds.append(os.pidfd_open(pid))
            except OSError:  # gone and reaped, or no pidfd on this kernel
                continue
        try:
            exited = set(select.select(fds, [], [], 0)[0]) if fds else set()
            alive = [fd for fd in fds if fd not in exited]
            if not alive:
                self._real.sleep(seconds)
            else:
                select.select(alive + _Agent.result_fds(), [], [], seconds)
        finally:
            for fd in fds:
                os.close(fd)


def _wake_on_worker_exit(patches: Patches) -> None:
    from nvidia_resiliency_ext.fault_tolerance import launcher

    if hasattr(os, "pidfd_open") and not isinstance(launcher.time, _WakeOnWorkerExit):
        patches.set(launcher, "time", _WakeOnWorkerExit(launcher.time))


def _titled_rank_monitors(patches: Patches) -> None:
    """Rank monitors are forked from the launcher too: name them (`resctl-rank-monitor local=N`)."""
    import re

    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

    run = RankMonitorServer.run

    def titled_run(*args: Any, **kwargs: Any) -> Any:
        from resctl.launch.titles import set_title

        local = re.search(r"rmon(\d+)\.socket$", str(kwargs.get("ipc_socket_path", "")))
        set_title("resctl-rank-monitor" + (f" local={local[1]}" if local else ""))
        try:  # monitors stay in the launcher's process group (a worker's group is its own) ...
            os.setpgid(0, os.getpgid(os.getppid()))
        except OSError:
            pass
        _die_with_parent(signal.SIGKILL)  # ... and never outlive it (they hold its stdout open)
        return run(*args, **kwargs)

    patches.set(RankMonitorServer, "run", staticmethod(titled_run))


def _quick_leftover_cleanup(patches: Patches) -> None:
    """NVRx 0.6+ cleans up after stopped workers with `killpg(SIGTERM)` on their process groups, a
    fixed 1 s sleep, then `killpg(SIGKILL)`: a second on every restart. Wait only while a group still
    has members (at most that second)."""
    import inspect

    from nvidia_resiliency_ext.fault_tolerance import launcher

    original = getattr(launcher, "terminate_mp_processes", None)
    if original is None or list(inspect.signature(original).parameters) != ["allowed_pgids"]:
        return  # 0.4/0.5 only reap orphans of the workers, without a wait

    def terminate_leftovers(allowed_pgids: Any) -> None:
        groups = [g for g in allowed_pgids if g not in (0, 1, os.getpgrp())]  # never the launcher's own group
        for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0.0)):
            for pgid in groups:
                try:
                    os.killpg(pgid, sig)
                except OSError:
                    pass
            deadline = time.monotonic() + wait
            while groups and time.monotonic() < deadline:
                groups = [g for g in groups if _group_alive(g)]
                time.sleep(0.01)

    patches.set(launcher, "terminate_mp_processes", terminate_leftovers)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return True


def _child_of_launcher() -> None:
    """In every process forked from the launcher (workers, rank monitors): NVRx's code unpatched, a
    process group of its own, so a launcher's `killpg` of a worker's group reaches the worker and its
    children, never the launcher, `resctl run` or the shell that started them, and a SIGTERM when the
    launcher dies (a worker then stops as for a job stop; an unsupervised worker has no future)."""
    if os.getppid() != _LAUNCHER_PID[0]:
        return  # a fork inside a worker (the hook is inherited): NVRx's monitor setsid()s, DataLoader workers...
    undo_adapters()
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    _die_with_parent(signal.SIGTERM)


_LAUNCHER_PID = [0]  # set in main(): the process whose children `_child_of_launcher` looks after


def _die_with_parent(sig: int) -> None:
    import ctypes
    import ctypes.util

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent == 1:  # the launcher died before the line above: it will not signal us
        os.kill(os.getpid(), sig)


def apply_adapters() -> list[str]:
    """Patch what the installed versions need (once); returns what was patched."""
    if PATCHES:
        return []
    _bridge_versions(PATCHES)
    if stop.ENV in os.environ:  # the quick stops need the marker file main() set up
        _quick_restart_stops(PATCHES)
    _wake_on_worker_exit(PATCHES)
    _titled_rank_monitors(PATCHES)
    _quick_leftover_cleanup(PATCHES)
    return PATCHES.applied


def undo_adapters() -> None:
    PATCHES.undo()
    _Agent.current = None


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def _launcher_title() -> str:
    import json

    try:
        with open(os.environ["RESCTL_PLAN"], encoding="utf-8") as f:
            return "resctl-launcher " + os.path.basename(json.load(f)["target"]["script"])
    except (KeyError, OSError, ValueError, TypeError):
        return "resctl-launcher"


LOG_FILE = "launcher.log"
RESTART_MESSAGE = "will restart worker group"  # torch elastic's line when a worker group failed
FAILED_MESSAGE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")  # ... and a worker's failure


class FaultLines(logging.Handler):
    """Console handler of a quiet launcher: one `resctl:` line per worker-group restart, naming the
    failure before it (its last traceback line); the rest of both records is in launcher.log."""

    def __init__(self, console: Any) -> None:
        super().__init__(logging.INFO)
        self.console = console
        self.failure = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            failed = FAILED_MESSAGE.search(message)
            if failed:
                text = message + "\n" + (str(record.exc_info[1]) if record.exc_info and record.exc_info[1] else "")
                lines = [line.strip() for line in text.splitlines() if line.strip()]
                cause = lines[-1] if len(lines) > 1 else f"exit code {failed.group(1)}"
                self.failure = f"local rank {failed.group(2)} failed ({cause[:200]})"
            elif RESTART_MESSAGE in message:
                left = re.search(r"(\d+)/(\d+) attempts left", message)
                restarts = f", {left.group(1)} of {left.group(2)} restarts left" if left else ""
                self.console.write(f"resctl: {self.failure or 'a worker failed'}; restarting the workers{restarts} "
                                   "(details: launcher.log in the run directory)\n")
                self.console.flush()
                self.failure = ""
        except Exception:  # noqa: BLE001 - a console line is never worth a launcher crash
            self.handleError(record)


class _LogSys:
    """Stands in for the `sys` module inside NVRx's rank-monitor module: its loggers (made in the
    forked monitor process) write to the launcher's log file instead of the console."""

    def __init__(self, real: Any, log: Any) -> None:
        self._real = real
        self.stdout = self.stderr = log

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


QUIET = Patches("quiet launcher")  # not undone at fork: the rank monitors are forked children


def quiet_logs(env: Any = os.environ) -> str | None:
    """Send the launcher's log lines, its warnings and its rank monitors' lines to
    `<run_dir>/launcher.log`, keeping one console line per worker-group restart; returns the file,
    or None when the console keeps them (`RESCTL_VERBOSE=1`, no run dir). The process's own
    stdout and stderr, which the workers inherit, are left alone."""
    import sys

    run_dir = env.get("RESCTL_RUN_DIR")
    if not run_dir or env.get("RESCTL_VERBOSE") == "1" or QUIET:
        return None
    path = os.path.join(run_dir, LOG_FILE)
    log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - for the process's life
    logging.basicConfig(  # before NVRx's own basicConfig (at its import), which then does nothing
        stream=log, level=os.getenv("FT_LAUNCHER_LOGLEVEL", "INFO"),
        format=f"[%(asctime)s] [%(levelname)s] [ft_launcher{os.getpid()}] %(message)s",
    )
    logging.captureWarnings(True)
    logging.getLogger().addHandler(FaultLines(sys.stderr))
    from nvidia_resiliency_ext.fault_tolerance import rank_monitor_server

    QUIET.set(rank_monitor_server, "sys", _LogSys(sys, log))
    return path


def main() -> None:
    import atexit

    quiet_logs()

    marker = stop.file_for(os.getpid())
    os.environ[stop.ENV] = str(marker)
    atexit.register(stop.clear, marker)
    apply_adapters()
    _LAUNCHER_PID[0] = os.getpid()
    os.register_at_fork(after_in_child=_child_of_launcher)
    from resctl.launch.launcher_logs import install  # no secrets or stop tracebacks in its log

    install()
    if os.environ.get("RESCTL_PRELOAD") == "1":
        preload()
    from resctl.launch.titles import set_title

    set_title(_launcher_title())
    from nvidia_resiliency_ext.fault_tolerance.launcher import main as launcher_main

    try:
        launcher_main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    exit_quickly(code)


def exit_quickly(code: int) -> None:
    """Exit as the interpreter would, less its teardown of every module (torch's takes about
    0.5 s): the atexit handlers run (logging's flush, multiprocessing's children, the marker file),
    then the standard streams are flushed."""
    import atexit
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
