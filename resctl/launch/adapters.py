"""resctl's owned, undoable adapters of NVRx's `ft_launcher` and torch elastic, applied by
`resctl.launch.ft_entry` before the launcher runs. Gaps between an NVRx release and the installed
torch, and the launcher's slow paths, are bridged without forking NVRx. Every change is a patch
(`resctl.patching`) and checks for the exact gap it fills:

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
- **Done when exited.** A forked worker that exits 0 without a return value (`sys.exit()`,
  `os._exit(0)`) is done; torch waited for its value forever (`_done_when_exited`).
- **torchrun's store.** The workers' MASTER_ADDR/MASTER_PORT are the launcher's rendezvous store and
  TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun: no worker hosts the group's store, so none
  takes it away from the others when it ends first (`_agent_store`).
- **No abbreviations.** A script's argument (`--workers`) is never read as an abbreviation of a
  launcher option (`--workers-stop-timeout`): argparse's `allow_abbrev` is off (`_no_abbreviations`).
- **Titles.** The launcher, each worker and each rank monitor name themselves (`resctl.launch.titles`).
- **Wake on worker exit.** The launcher polls its workers every `--monitor-interval` (5 s, the AWS
  default). Its sleep now also ends when a worker process exits (pidfd), so neither a dead rank nor
  the end of the job waits for the next poll; the interval still paces the other checks.
- **Own process groups, quick leftover cleanup.** NVRx 0.6+ `killpg`s the stopped workers' process
  groups and then sleeps 1 s. Forked workers shared the launcher's group, so on 0.7 the first restart
  SIGTERMed the launcher and `resctl run` themselves. Every process forked from the launcher now leads
  its own group, and the cleanup waits only while a group still has members.

- **A job stop is never lost.** NVRx 0.4.1 swallows the SIGTERM that stops the job when it lands
  during a restart (`terminate_mp_processes` and the rank monitors' close message catch every
  `Exception`, its `SignalException` included): the job trained on to the end and exited 0. The
  launcher now remembers the signal; a stop swallowed during a restart is handed to the new workers
  (`stop.JOB_STOP_ENV`: each begins the job stop, a final save at its first step boundary, as soon
  as its shim is in place), the launcher stops them after `--term-timeout` if they have not left,
  and no further restart is made. A stop swallowed anywhere else is raised again at the next poll.

- **resctl's rendezvous** (`launch.rendezvous = "resctl"`, issue 25). The `c10d` handler ft_launcher
  registers is `resctl.launch.owned_rdzv`'s, on the store NVRx's `create_backend` makes: O(1) store
  requests per node and round, no wait for a lost node's keep-alive to expire before a restart
  round, the keep-alive interval from the profile. torch elastic's rank assignment takes each node's
  local world size from the round's outcome instead of an all-gather of N keys (`_owned_rendezvous`).

Forked workers inherit the launcher's memory: the patches are undone in every child at fork
(`install_fork_hook`).
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Any

from resctl.launch import spares, stop
from resctl.launch.preload import LatePreload
from resctl.patching import Patches

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
            failed = [s for s in ready if self.processes[self.sentinels[s]].exitcode not in (0, None)]
            if failed:
                # The failed worker first: torch reports the first failed sentinel it finds, and the
                # survivors signalled below end at once too (a rank that failed must not be blamed on them).
                self.sentinels = {s: self.sentinels[s] for s in sorted(self.sentinels, key=lambda s: s not in failed)}
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
        from resctl.health.gate import before_cycle

        before_cycle(self)  # resctl.health.gate: may stop the launcher before this cycle's workers start
        _Agent.current = self
        stop.clear(_stop_file())
        stop.clear_left(_stop_file())
        LatePreload.before_fork()
        started = start_workers(self, *args, **kwargs)
        LatePreload.workers_started()
        return started

    patches.set(agent_cls, "_stop_workers", marked_stop_workers)
    patches.set(agent_cls, "_start_workers", tracked_start_workers)


def _done_when_exited(patches: Patches) -> None:
    """A forked worker is done when it exits with 0, with or without a return value.

    torch's `MultiprocessContext` counts a worker as done only when it has posted its function's
    return value; a worker that ends by `sys.exit()`, `os._exit(0)` or a KeyboardInterrupt swallowed
    by torch's spawn wrapper exits 0 without one, and the launcher waited for it forever. Once every
    worker has either posted or exited 0, the others are released and awaited here, so the
    context's own join finds them all gone (NVRx 0.4's copy joins only one more)."""
    import importlib

    for module in ("nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing.api",
                   "torch.distributed.elastic.multiprocessing.api"):
        try:
            cls = importlib.import_module(module).MultiprocessContext
        except (ImportError, AttributeError):
            continue
        patches.set(cls, "_poll", _polling_exits(cls._poll))


def _polling_exits(poll: Any) -> Any:
    def poll_exits(self: Any) -> Any:
        pcontext = self._pc
        if pcontext is not None:
            for local_rank, proc in enumerate(pcontext.processes):
                # Exit code first: a worker that exited can post nothing more.
                if local_rank not in self._return_values and proc.exitcode == 0:
                    queue = self._ret_vals[local_rank]
                    self._return_values[local_rank] = None if queue.empty() else queue.get()
            if self._is_done():
                self._worker_finished_event.set()
                for proc in pcontext.processes:
                    proc.join()
        return poll(self)

    return poll_exits


AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
#: The key space of this rendezvous round's workers in the launcher's store (resctl.shim.agent_store).
STORE_PREFIX_ENV = "RESCTL_STORE_PREFIX"
_ROUND_KEY = "resctl/workers_prefix"


def _tcp_store(store: Any) -> Any:
    """The TCPStore under `store` (the rendezvous hands the agent a PrefixStore over it), or None."""
    import torch.distributed as dist

    for _ in range(8):  # PrefixStores nest a few deep at most
        if isinstance(store, dist.TCPStore):
            return store
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


class _SharedStore:
    """This cycle's workers' store: the rendezvous store's port (None: NVRx's own) and their key
    space in it."""

    port: str | None = None
    prefix = ""


def _agent_store(patches: Patches) -> None:
    """Workers use the launcher's rendezvous store as theirs, as torchrun's do.

    torchrun (torch >= 2.4, c10d rendezvous) gives its workers the agent's TCPStore: MASTER_ADDR and
    MASTER_PORT are the rendezvous store's and TORCHELASTIC_USE_AGENT_STORE=True, so `env://` and
    `tcp://MASTER_ADDR:MASTER_PORT` connect to a store that outlives every worker. NVRx's launcher
    (0.4/0.5) hands out a free port that rank 0's worker then hosts: when rank 0 left first, a peer's
    last store call failed (a C++ stack on the console, and a rank that finished counted as failed).
    `_get_master_addr_port` (read by every node's agent before it starts workers) now answers with the
    rendezvous store's endpoint, and the workers' environment says the store is the agent's. With
    `--master-port` the rendezvous itself runs on that port (`resctl.launch.rendezvous`), so the
    workers' MASTER_PORT is the one the user gave, as under torchrun. A store that is not a TCPStore
    leaves NVRx's behaviour as it is."""
    try:  # NVRx 0.4/0.5 carry their own copy of torch elastic; 0.6+ use torch's
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api
    except ImportError:
        from torch.distributed.elastic.agent.server import api  # type: ignore[no-redef]
    from nvidia_resiliency_ext.fault_tolerance import launcher

    if not hasattr(api.SimpleElasticAgent, "_get_master_addr_port") or not hasattr(launcher, "start_processes"):
        return
    get_master = api.SimpleElasticAgent._get_master_addr_port
    start_processes = launcher.start_processes

    def shared_master(store: Any) -> Any:
        tcp = _tcp_store(store)
        if tcp is None:
            _SharedStore.port = None
            return get_master(store)
        _SharedStore.port = str(tcp.port)
        # One key space per rendezvous round, the same on every node: the first agent of the round
        # to get here names it (`store` is this round's). A restart count would not do: a replaced
        # node's launcher counts from 0 again while the others are at 1.
        import uuid

        token = store.compare_set(_ROUND_KEY, "", uuid.uuid4().hex)
        _SharedStore.prefix = f"/worker/{token.decode() if isinstance(token, bytes) else token}"
        return str(tcp.host), int(tcp.port)

    def start_sharing(*args: Any, **kwargs: Any) -> Any:
        port = _SharedStore.port
        for env in (kwargs.get("envs") or {}).values() if port else ():
            if env.get("MASTER_PORT") == port:  # this cycle's workers were sent there
                env[AGENT_STORE_ENV] = "True"
                env[STORE_PREFIX_ENV] = _SharedStore.prefix
        return start_processes(*args, **kwargs)

    patches.set(api.SimpleElasticAgent, "_get_master_addr_port", staticmethod(shared_master))
    patches.set(launcher, "start_processes", start_sharing)


#: Seconds the peers of a worker that *exited* with a failing code keep running before the launcher
#: looks (and stops them): torchrun's monitor interval, so a peer's last lines (its own traceback,
#: an exit message) reach the console at least as often as under torchrun. A worker killed by a
#: signal (kill -9, OOM, segfault) gets no grace: that is the fast-recovery path.
PEER_GRACE = 0.1


def _exited_failing(pid: int) -> bool:
    """`pid` (a child) has exited with a code other than 0 (not killed by a signal); not reaped."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):  # not our child, or reaped meanwhile
        return False
    return info is not None and info.si_code == os.CLD_EXITED and info.si_status != 0


class _WakeOnWorkerExit:
    """Stands in for the `time` module inside NVRx's launcher module: `sleep()` also returns when
    a worker that was alive exits (after `PEER_GRACE` when it exited with a failing code).
    Everything else is the real module."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def sleep(self, seconds: float) -> None:
        _JobStop.check()
        LatePreload.maybe_start()
        fds: dict[int, int] = {}
        for pid in _Agent.live_pids():
            try:
                fds[os.pidfd_open(pid)] = pid
            except OSError:  # gone and reaped, or no pidfd on this kernel
                continue
        try:
            exited = set(select.select(list(fds), [], [], 0)[0]) if fds else set()
            alive = [fd for fd in fds if fd not in exited]
            if not alive:
                self._real.sleep(seconds)
                return
            start = self._real.monotonic()
            woke = select.select(alive + _Agent.result_fds(), [], [], seconds)[0]
            if any(fd in fds and _exited_failing(fds[fd]) for fd in woke):
                self._real.sleep(max(0.0, min(PEER_GRACE, seconds - (self._real.monotonic() - start))))
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


class _JobStop:
    """A SIGTERM/SIGINT/SIGHUP/SIGQUIT the launcher received, remembered until the launcher acts on it."""

    signum: int | None = None
    peer = False  # the stop is another node's, taken on here (resctl.launch.spares): no signal of its own
    inside_run = False  # in the agent's `_invoke_run`: where a swallowed stop can be raised again
    restarting = False  # in `_restart_workers`: a stop now waits for the new workers (no one to save)
    deadline: float | None = None  # set when workers were started with the stop in their env

    @classmethod
    def reset(cls) -> None:
        cls.signum, cls.inside_run, cls.restarting, cls.deadline, cls.peer = None, False, False, None, False

    @classmethod
    def exception(cls) -> BaseException:
        from nvidia_resiliency_ext.fault_tolerance.launcher import SignalException

        sig = signal.Signals(cls.signum or signal.SIGTERM)
        return SignalException(f"Process {os.getpid()} got signal: {int(sig)}", sigval=sig)

    @classmethod
    def check(cls) -> None:
        """At the monitor loop's sleep: raise the stop again when it was swallowed, or when the
        workers it was handed to have not left within `--term-timeout` (they are stopped then)."""
        if cls.signum is None or not cls.inside_run:
            return
        if cls.deadline is None or time.monotonic() >= cls.deadline:
            raise cls.exception()


def stop_exit_code(code: int) -> int:
    """The launcher's exit code: 128+N when signal N stopped the job and it did not end well (NVRx
    exits 1), so a launcher signalled directly (not through `resctl run`) still exits 143."""
    stopped = _JobStop.signum is not None and (code != 0 or _JobStop.peer)
    return 128 + (_JobStop.signum or 0) if stopped else code


def _elastic_api() -> Any:
    try:  # NVRx 0.4/0.5 start workers through their own copy of torch elastic; 0.6+ through torch's
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing import api
    except ImportError:
        from torch.distributed.elastic.multiprocessing import api
    return api


def _stops_never_lost(patches: Patches) -> None:
    """Remember a stop signal; a stop that arrives while workers are restarted goes to the new
    workers (the old ones cannot save: a peer is gone), one swallowed elsewhere is raised again, and
    no restart is made once the stop was handed over."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    api = _elastic_api()
    agent_cls = launcher.LocalElasticAgent
    handler = getattr(api, "_terminate_process_handler", None)
    if handler is None or not all(hasattr(agent_cls, m) for m in ("_invoke_run", "_restart_workers", "_start_workers",
                                                                       "_monitor_workers")):
        return  # another launcher shape: nothing known to swallow a stop there

    def remembering_handler(signum: int, frame: Any) -> None:
        if _JobStop.signum is None:
            _JobStop.signum = signum
        if not _JobStop.restarting:
            handler(signum, frame)  # raises SignalException

    patches.set(api, "_terminate_process_handler", remembering_handler)  # looked up when workers start
    invoke_run, restart_workers, start_workers, monitor_workers = (
        agent_cls._invoke_run, agent_cls._restart_workers, agent_cls._start_workers, agent_cls._monitor_workers)

    def guarded_invoke_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        _JobStop.inside_run = True
        try:
            return invoke_run(self, *args, **kwargs)
        finally:
            _JobStop.inside_run = False

    def restart_unless_stopped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _JobStop.signum is not None and _JobStop.deadline is not None:
            raise _JobStop.exception()  # the workers left on the job stop: end the job, no restart
        _JobStop.restarting = True
        try:
            return restart_workers(self, *args, **kwargs)
        finally:
            _JobStop.restarting = False

    def monitor_for_peer_stops(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = monitor_workers(self, *args, **kwargs)
        if (_JobStop.signum is None and getattr(result.state, "name", "") in ("FAILED", "UNHEALTHY")
                and _left_on_a_peers_stop() and spares.decide_after_peer_stop(self)):
            _JobStop.signum, _JobStop.deadline, _JobStop.peer = signal.SIGTERM, time.monotonic(), True
            raise _JobStop.exception()  # before NVRx's restart: this launcher stops as for its own SIGTERM
        return result

    def start_with_stop(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _JobStop.signum is not None and _JobStop.inside_run:
            # The new workers begin the job stop (and its final save) themselves, once their shim
            # can act on it: a SIGTERM now would reach none.
            os.environ[stop.JOB_STOP_ENV] = str(_JobStop.signum)
            _JobStop.deadline = time.monotonic() + float(getattr(self, "_term_timeout", 0) or 30)
        return start_workers(self, *args, **kwargs)

    patches.set(agent_cls, "_invoke_run", guarded_invoke_run)
    patches.set(agent_cls, "_restart_workers", restart_unless_stopped)
    patches.set(agent_cls, "_start_workers", start_with_stop)
    patches.set(agent_cls, "_monitor_workers", monitor_for_peer_stops)
    patches.on_undo(_JobStop.reset)


def _left_on_a_peers_stop() -> bool:
    """This launcher's workers all left on another node's job stop (none on a SIGTERM of its own)."""
    return stop.ENV in os.environ and stop.left(_stop_file()) == {stop.PEER}


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
    try:  # not a session of its own, as torchrun's (start_new_session): measured, a new session per
        os.setpgid(0, 0)  # worker made an in-job restart ~0.15 s slower on a loaded 2-core VM (autogroups)
    except OSError:
        pass
    _die_with_parent(signal.SIGTERM)


_LAUNCHER_PID = [0]  # set in main(): the process whose children `_child_of_launcher` looks after


def _die_with_parent(sig: int) -> None:
    from resctl.launch.lifeline import die_with_parent

    die_with_parent(sig)


def _no_abbreviations(patches: Patches) -> None:
    """The script's own arguments are never taken for the launcher's.

    argparse matches abbreviated options while it scans the whole command line, the script's
    arguments included, so `resctl run train.py --workers 0` failed with "ambiguous option: --workers
    could match --workers-stop-timeout, ..." (NVRx's options; torchrun has none starting so). resctl
    writes every launcher option in full, so abbreviations are off."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    if not hasattr(launcher, "get_args_parser"):
        return
    get_args_parser = launcher.get_args_parser

    def parser_without_abbreviations(*args: Any, **kwargs: Any) -> Any:
        parser = get_args_parser(*args, **kwargs)
        parser.allow_abbrev = False
        return parser

    patches.set(launcher, "get_args_parser", parser_without_abbreviations)


def _owned_rendezvous(patches: Patches) -> None:
    """ft_launcher's `c10d` rendezvous handler is resctl's (`resctl.launch.owned_rdzv`) when the plan
    asks for it (`rdzv_rounds.IMPL_ENV`), on NVRx 0.4's launcher shape only."""
    from resctl.launch import rdzv_rounds

    if os.environ.get(rdzv_rounds.IMPL_ENV) != "resctl":
        return
    from nvidia_resiliency_ext.fault_tolerance import launcher

    register = getattr(launcher, "_register_ft_rdzv_handler", None)
    try:
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api
    except ImportError:
        return
    if register is None or not hasattr(api.SimpleElasticAgent, "_share_and_gather"):
        return
    keep_alive = float(os.environ.get(rdzv_rounds.KEEP_ALIVE_ENV) or 1.0)
    misses = int(os.environ.get(rdzv_rounds.MISSES_ENV) or 3)

    def register_owned() -> None:
        register()  # NVRx's: swaps torch's c10d handler for its own; ours replaces that one
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous import rendezvous_handler_registry

        rendezvous_handler_registry._registry.pop("c10d", None)
        rendezvous_handler_registry.register("c10d", lambda params: _owned_handler(params, keep_alive, misses))

    share_and_gather, rendezvous = api.SimpleElasticAgent._share_and_gather, api.SimpleElasticAgent._rendezvous

    def rendezvous_with_spec(self: Any, worker_group: Any) -> Any:
        handler, spec = worker_group.spec.rdzv_handler, worker_group.spec
        if hasattr(handler, "local_world_size"):  # what this node's line in the round says
            handler.local_world_size, handler.role = spec.local_world_size, spec.role
        return rendezvous(self, worker_group)

    def gather_from_outcome(self: Any, store: Any, group_rank: int, group_world_size: int, spec: Any) -> Any:
        outcome = getattr(spec.rdzv_handler, "_outcome", None)
        if outcome is None or outcome.role != spec.role or outcome.size != group_world_size:
            return share_and_gather(self, store, group_rank, group_world_size, spec)
        return [api._RoleInstanceInfo(spec.role, r, outcome.local_world_sizes[r]) for r in range(outcome.size)]

    patches.set(launcher, "_register_ft_rdzv_handler", register_owned)
    patches.set(api.SimpleElasticAgent, "_rendezvous", rendezvous_with_spec)
    patches.set(api.SimpleElasticAgent, "_share_and_gather", gather_from_outcome)


def _owned_handler(params: Any, keep_alive: float, misses: int) -> Any:
    """What NVRx's `_create_ft_rdzv_handler` does (its store, its IPC socket from the ranks, its GPU
    health check), with resctl's handler."""
    from nvidia_resiliency_ext.fault_tolerance import launcher
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.c10d_rendezvous_backend import (
        create_backend,
    )
    from nvidia_resiliency_ext.fault_tolerance.ipc_connector import IpcConnector
    from nvidia_resiliency_ext.shared_utils.health_check import GPUHealthCheck

    from resctl.launch import owned_rdzv

    _, store = create_backend(params)
    connector = IpcConnector(launcher.FT_LAUNCHER_IPC_SOCKET)
    connector.start_receiving()
    handler = owned_rdzv.OwnedRendezvousHandler(
        store, owned_rdzv.settings_from(params, keep_alive, misses), connector=connector,
        health_check=lambda: GPUHealthCheck()())
    handler.on_register = _write_slot
    return handler


def _write_slot(slot: int) -> None:
    """This node's member slot, in the run directory, for `resctl run` (it marks the slot dead when
    the launcher dies: the next restart round then waits for no keep-alive to expire)."""
    from pathlib import Path

    from resctl.launch import rdzv_rounds

    run_dir = os.environ.get("RESCTL_RUN_DIR")
    if run_dir:
        try:
            (Path(run_dir) / rdzv_rounds.SLOT_FILE.format(pid=os.getpid())).write_text(str(slot))
        except OSError:
            pass


def apply_adapters() -> list[str]:
    """Patch what the installed versions need (once); returns what was patched."""
    if PATCHES:
        return []
    _bridge_versions(PATCHES)
    _done_when_exited(PATCHES)
    _agent_store(PATCHES)
    _owned_rendezvous(PATCHES)
    _no_abbreviations(PATCHES)
    if stop.ENV in os.environ:  # the quick stops need the marker file main() set up
        _quick_restart_stops(PATCHES)
    _wake_on_worker_exit(PATCHES)
    _titled_rank_monitors(PATCHES)
    _quick_leftover_cleanup(PATCHES)
    _stops_never_lost(PATCHES)
    spares.spare_lines(PATCHES)
    return PATCHES.applied


def undo_adapters() -> None:
    PATCHES.undo()
    _Agent.current = None


def install_fork_hook(launcher_pid: int) -> None:
    """Look after every process forked from `launcher_pid` (`_child_of_launcher`)."""
    _LAUNCHER_PID[0] = launcher_pid
    os.register_at_fork(after_in_child=_child_of_launcher)
