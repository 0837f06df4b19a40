"""resctl's elastic agent: NVRx's `LocalElasticAgent` with resctl's behaviour in its own methods.

ft_launcher builds its agent by name (`launcher.LocalElasticAgent(...)` in `launch_agent`); `install`
puts `ResctlAgent` under that name, once, in the launcher process. Everything the launcher does
differently under resctl is a method of that one class, and the job's state (the stop signal, the
workers' store, the process context it started) is in the agent object:

- **Seams** (torch elastic's, which NVRx's agent fills): `_start_workers` (the health gate, a job stop
  handed to new workers, the late preload, the stop signals), `_stop_workers` (the restart-stop marker),
  `_monitor_workers` (another node's stop), `_restart_workers` (none once the job is stopping),
  `_shutdown` (quick leftover cleanup on 0.6+), `run` (a failed group is a failure on 0.4).
- **Quick restart stops.** When a forked worker dies, torch's `ProcessContext.join` SIGTERMs the others
  and waits a hard-coded 30 s before SIGKILL; NVRx's stop of exec'd workers waits
  `--workers-stop-timeout`. A survivor blocked in an NCCL or gloo collective never runs a Python SIGTERM
  handler, so every restart paid the full wait. The agent names the stopped PIDs in the restart-stop
  marker (`resctl.launch.stop`), so the shim leaves at once instead of saving, and waits at most
  `--workers-stop-timeout` (the join of the process context it started: `_ProcessContextSeams`).
- **Done when exited.** A forked worker that exits 0 without a return value (`sys.exit()`,
  `os._exit(0)`) is done; torch waited for its value forever.
- **torchrun's store.** The workers' MASTER_ADDR/MASTER_PORT are the launcher's rendezvous store and
  TORCHELASTIC_USE_AGENT_STORE=True, as under torchrun: no worker hosts the group's store, so none
  takes it away from the others when it ends first. Each round's workers get a key space of their own
  there (`contract.STORE_PREFIX`, `resctl.shim.agent_store`).
- **Wake on worker exit.** The launcher polls its workers every `--monitor-interval` (5 s, the AWS
  default). Its sleep (`LauncherClock`) also ends when a worker process exits (pidfd) or posts its
  result, so neither a dead rank nor the end of the job waits for the next poll.
- **A job stop is never lost.** NVRx 0.4.1 swallows the SIGTERM that stops the job when it lands during
  a restart: the job trained on to the end and exited 0. The agent's signal handler remembers the
  signal (`JobStop`); a stop during a restart is handed to the new workers (`stop.JOB_STOP_ENV`: each
  begins the job stop, a final save at its first step boundary), the launcher stops them after
  `--term-timeout` if they have not left, and no further restart is made. A stop swallowed anywhere
  else is raised again at the next poll.
- **The next round at once.** On NVRx 0.6+'s barrier rendezvous a restarting node moves to the round
  that is open before it joins (`_to_the_open_round`), instead of NVRx's poll of a second.
- **Quick exit.** NVRx 0.6+'s store host sleeps 3 s before it exits, so that the other nodes can read
  the store's last state; the agent waits only until every other node of the last round said it is
  done (none on a single node) and no live spare still reads the store, at most those 3 s.

The private names of NVRx and torch this module relies on are listed, with the versions they were
checked on, in `resctl.launch.nvrx_private` (a test fails when an installed version lacks one).
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing.connection
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import launcher as nvrx

from resctl.health.gate import before_cycle
from resctl.launch import gpu_reclaim, owned_rdzv, rdzv_install, spares, stop
from resctl.launch.exits import sleep_until_exit
from resctl.launch.preload import LatePreload
from resctl.launch.rdzv_rounds import RendezvousView
from resctl.launch.signal_trace import SignalTrace
from resctl.launch.standby import Standbys
from resctl.patching import Patches
from resctl.profile import contract

try:  # NVRx 0.4/0.5 start workers through their own copy of torch elastic; 0.6+ through torch's
    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing import api as elastic_api
except ImportError:
    from torch.distributed.elastic.multiprocessing import api as elastic_api  # type: ignore[no-redef]

_ROUND_KEY = "resctl/workers_prefix"
#: Each agent of the last round adds 1 here once it is done with the store (the store host waits for them).
_DONE_KEY = "resctl/agents_done"

_STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: NVRx 0.6+ sets this to 1 in the launcher's environment, for torch's rank assignment (its fast path, which
#: reads no store keys); the workers inherited it, where torchrun's see no such name.
IDENTICAL_ENV = "TORCH_ELASTIC_WORKER_IDENTICAL"
#: launcher.log's line just before a cycle's workers are forked, with this launcher's count of such starts.
STARTING_WORKERS = "resctl: starting workers, start"
log = logging.getLogger(__name__)
STOP_SIGNUMS = frozenset(int(getattr(signal, name)) for name in _STOP_SIGNALS if hasattr(signal, name))


@dataclass
class JobStop:
    """A SIGTERM/SIGINT/SIGHUP/SIGQUIT the launcher received, remembered until the launcher acts on it."""

    signum: int | None = None
    peer: bool = False  # the stop is another node's, taken on here (resctl.launch.spares): no signal of its own
    inside_run: bool = False  # in the agent's `_invoke_run`: where a swallowed stop can be raised again
    restarting: bool = False  # in `_restart_workers`: a stop now waits for the new workers (no one to save)
    deadline: float | None = None  # set when workers were started with the stop in their env
    trace: SignalTrace = field(default_factory=SignalTrace)  # every stop signal caught, swallowed or not

    def exception(self) -> BaseException:
        sig = signal.Signals(self.signum or signal.SIGTERM)
        return nvrx.SignalException(f"Process {os.getpid()} got signal: {int(sig)}", sigval=sig)

    def check(self) -> None:
        """At the monitor loop's sleep: raise the stop again when it was swallowed (also one that
        torch's handler raised where it was dropped: `SignalTrace`), or when the workers it was
        handed to have not left within `--term-timeout` (they are stopped then)."""
        caught = self.trace.take(STOP_SIGNUMS)
        if self.signum is None:
            self.signum = caught
        if self.signum is None or not self.inside_run:
            return
        if self.deadline is None or time.monotonic() >= self.deadline:
            raise self.exception()

    def exit_code(self, code: int) -> int:
        """The launcher's exit code: 128+N when signal N stopped the job and it did not end well (NVRx
        exits 1), so a launcher signalled directly (not through `resctl run`) still exits 143."""
        if self.signum is None:  # a stop that torch's handler raised and no one recorded (SignalTrace)
            self.signum = self.trace.take(STOP_SIGNUMS)
        stopped = self.signum is not None and (code != 0 or self.peer)
        return 128 + (self.signum or 0) if stopped else code


class LauncherClock:
    """Stands in for the `time` module inside NVRx's launcher module, whose monitor loop and exit
    paths sleep through it: `sleep()` is the agent's (`ResctlAgent.sleep`). Everything else is the
    real module."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.agent: ResctlAgent | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def sleep(self, seconds: float) -> None:
        if self.agent is None:
            self._real.sleep(seconds)
        else:
            self.agent.sleep(seconds)


def _tcp_store(store: Any) -> Any:
    """The TCPStore under `store` (the rendezvous hands the agent a PrefixStore over it), or None."""
    for _ in range(8):  # PrefixStores nest a few deep at most
        if isinstance(store, dist.TCPStore):
            return store
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


@dataclass
class SharedStore:
    """This round's workers' store: the rendezvous store's endpoint (port None: NVRx's own) and their key space."""

    host: str = ""
    port: str | None = None
    prefix: str = ""


class _ProcessContextSeams:
    """What the agent changes in the process context it started for forked workers (torch's
    `MultiprocessContext`, NVRx 0.4's copy of it), on that object only, through `patches`.

    torch builds the context inside NVRx's `_start_workers` (`start_processes`), so a subclass of it
    would need a module-level patch of the launcher; the two methods are replaced on the one object
    instead, which lives as long as the workers' round (nothing to undo: the next round's is new)."""

    def __init__(self, agent: ResctlAgent, pcontext: Any) -> None:
        self.agent, self.pcontext = agent, pcontext
        self.patches = Patches("agent.process_context")
        pc = getattr(pcontext, "_pc", None)  # torch.multiprocessing's ProcessContext of the workers
        if pc is not None and agent.stop_file is not None:
            self._join = self.patches.set(pc, "join", self.quick_join)
        self._saving_since: float | None = None  # when the first worker that left on a job stop was seen gone
        if (pc is not None and hasattr(pcontext, "_ret_vals")) or hasattr(pcontext, "subprocess_handlers"):
            self._poll = self.patches.set(pcontext, "_poll", self.poll_exits)

    def quick_join(self, timeout: float | None = None, grace_period: float | None = None) -> Any:
        """A failed worker's peers are marked as stopped for a restart and SIGTERMed at once; the
        stop waits `--workers-stop-timeout` at most (torch: 30 s, hard-coded)."""
        pc, limit = self.pcontext._pc, self.agent.stop_timeout()
        if limit is not None and pc.sentinels:
            ready = multiprocessing.connection.wait(list(pc.sentinels), timeout=0)
            failed = [s for s in ready if pc.processes[pc.sentinels[s]].exitcode not in (0, None)]
            if failed:
                # The failed worker first: torch reports the first failed sentinel it finds, and the
                # survivors signalled below end at once too (a rank that failed must not be blamed on them).
                pc.sentinels = {s: pc.sentinels[s] for s in sorted(pc.sentinels, key=lambda s: s not in failed)}
                survivors = [p for p in pc.processes if p.is_alive()]
                self.agent.mark_restart(p.pid for p in survivors)
                for proc in survivors:
                    try:
                        os.kill(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            if grace_period is None:  # torch waits this, SIGTERMs, waits it again, then SIGKILLs
                grace_period = limit / 2
        try:
            return self._join(timeout, grace_period)
        except Exception as err:
            if hasattr(err, "error_pid") and not hasattr(err, "pid"):
                err.pid = err.error_pid  # type: ignore[attr-defined]  # NVRx 0.4's copy of torch elastic reads `.pid` (torch >= 2.6: error_pid)
            raise

    def poll_exits(self) -> Any:
        if getattr(self.pcontext, "_pc", None) is not None:
            settle_exited(self.pcontext)
        if self._others_still_saving():
            return None  # still running, as far as the agent is concerned
        return self._poll()

    def _others_still_saving(self) -> bool:
        """Workers left on a job stop, each after its final save, while others are still saving theirs (a peer
        node's stop reaches every rank here; a larger shard takes longer): not a failure that stops the rest
        for a restart, which would cut their saves. They get `launch.term_timeout` from the first one gone."""
        stop_file = self.agent.stop_file
        if stop_file is None or not stop.saving_after_a_stop(_exit_codes(self.pcontext), stop_file):
            self._saving_since = None
            return False
        now = time.monotonic()
        if self._saving_since is None:
            self._saving_since = now
            log.info("workers left on a job stop; waiting up to %.0f s for the others' final saves",
                     self.agent.term_timeout())
        return now - self._saving_since < self.agent.term_timeout()


def _exit_codes(pcontext: Any) -> dict[int, int | None]:
    """PID -> exit code (None: running) of each worker, forked or exec'd (codes are cached where read)."""
    pc = getattr(pcontext, "_pc", None)
    if pc is not None:
        return {p.pid: p.exitcode for p in pc.processes}
    return {h.proc.pid: h.proc.poll() for h in getattr(pcontext, "subprocess_handlers", {}).values()}


def settle_exited(pcontext: Any) -> None:
    """A forked worker is done when it exits with 0, with or without a return value.

    torch's `MultiprocessContext` counts a worker as done only when it has posted its function's
    return value; a worker that ends by `sys.exit()`, `os._exit(0)` or a KeyboardInterrupt swallowed
    by torch's spawn wrapper exits 0 without one, and the launcher waited for it forever. Once every
    worker has either posted or exited 0, the others are released and awaited here, so the
    context's own join finds them all gone (NVRx 0.4's copy joins only one more)."""
    pc = pcontext._pc
    if pc is None:
        return
    for local_rank, proc in enumerate(pc.processes):
        # Exit code first: a worker that exited can post nothing more.
        if local_rank not in pcontext._return_values and proc.exitcode == 0:
            queue = pcontext._ret_vals[local_rank]
            pcontext._return_values[local_rank] = None if queue.empty() else queue.get()
    if pcontext._is_done():
        pcontext._worker_finished_event.set()
        for proc in pc.processes:
            proc.join()


def _leftovers_wait_for_members() -> bool:
    """NVRx 0.6+ cleans up after stopped workers with `killpg(SIGTERM)`, a fixed 1 s sleep, then
    `killpg(SIGKILL)` (`terminate_mp_processes(allowed_pgids)`); 0.4 only reaps orphans, without a wait."""
    original = getattr(nvrx, "terminate_mp_processes", None)
    return original is not None and list(inspect.signature(original).parameters) == ["allowed_pgids"]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except OSError:
        return False
    return True


def terminate_leftovers(groups: set[int] | list[int], wait: float = 1.0) -> None:
    """SIGTERM the stopped workers' process groups, wait while a group still has members (at most
    `wait`), then SIGKILL what is left. Never the launcher's own group."""
    left = [g for g in groups if g not in (0, 1, os.getpgrp())]
    for sig, limit in ((signal.SIGTERM, wait), (signal.SIGKILL, 0.0)):
        for pgid in left:
            try:
                os.killpg(pgid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + limit
        while left and time.monotonic() < deadline:
            left = [g for g in left if _group_alive(g)]
            time.sleep(0.01)


class ResctlAgent(nvrx.LocalElasticAgent):  # type: ignore[misc, name-defined]
    """NVRx's agent for one node, with resctl's seams (see the module docstring)."""

    #: The user's own TORCH_ELASTIC_WORKER_IDENTICAL, as `install` found it (None: not set).
    user_identical: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # NVRx's value goes to the rank assignment only (`_assign_worker_ranks`); the user's stays where it was.
        self._identical = os.environ.pop(IDENTICAL_ENV, None) if self.user_identical is None else None
        self.job_stop = JobStop(trace=SignalTrace.start())
        self.shared = SharedStore()
        self.stop_file: Path | None = Path(os.environ[stop.ENV]) if stop.ENV in os.environ else None
        self.finished = False
        self._looked = False
        self.starts = 0  # the cycles whose workers this launcher started
        self._seams: _ProcessContextSeams | None = None
        self._gpu_baseline: list[float] | None = None  # each local GPU's used MB before the first workers
        self.restart_clock = stop.RestartClock()
        clock = getattr(nvrx, "time", None)
        if isinstance(clock, LauncherClock):
            clock.agent = self

    # -- what the agent knows about its workers --------------------------------------------------

    def stop_timeout(self) -> float | None:
        return float(getattr(self, "_workers_stop_timeout", 0) or 0) or None

    def term_timeout(self) -> float:
        """How long a job stop may take (`launch.term_timeout`)."""
        return float(getattr(self, "_term_timeout", 0) or 30)

    def live_pids(self) -> list[int]:
        pcontext = getattr(self, "_pcontext", None)
        if pcontext is None:
            return []
        try:
            return [int(p) for p in pcontext.pids().values()]
        except Exception:  # noqa: BLE001 - a context being torn down
            return []

    def result_fds(self) -> list[int]:
        """Read ends of the return-value queues of forked workers that have not reported yet.
        A forked worker that finished puts its result there and then waits for the launcher to
        read it before it exits (torch's `MultiprocessContext`), so its end is seen here first."""
        pcontext = getattr(self, "_pcontext", None)
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

    def mark_restart(self, pids: Any) -> None:
        if self.stop_file is not None:
            stop.mark_restart(self.stop_file, pids)

    # -- the seams ---------------------------------------------------------------------------------

    def run(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = super().run(*args, **kwargs)
        finally:
            self.finished = True
        state: Any = getattr(result, "state", None)
        if result is not None and getattr(state, "name", "") == "UNHEALTHY" and result.failures:
            # NVRx 0.4/0.5: a group that used up its restarts ends UNHEALTHY with failures, which the
            # launcher took for success (exit 0).
            result.state = type(state).FAILED
        return result

    def any_rank_failed(self) -> bool:
        """Asked by NVRx's launcher after a stop signal: exit non-zero? Also when resctl stopped the job because no
        restart can cure it (fatal.json: the health gate's stop before a cycle's workers start, a worker's fatal
        fault). NVRx reads the last process context, which after a stop between cycles is the closed one of
        the cycle before: one forked worker's failure is reported by its first poll only, and a one-GPU job
        whose crash loop the gate stopped exited 0 ("All ranks exited gracefully")."""
        run_dir = contract.Handed.of().run_dir
        return bool(super().any_rank_failed()) or (run_dir is not None and contract.read_fatal(run_dir) is not None)

    def _invoke_run(self, *args: Any, **kwargs: Any) -> Any:
        self.job_stop.inside_run = True
        try:
            return super()._invoke_run(*args, **kwargs)
        finally:
            self.job_stop.inside_run = False
            LatePreload.abandon()  # the job is over (done, failed or stopped): no fork after this
            Standbys.close()  # nor a worker to start in one

    def _rendezvous(self, worker_group: Any) -> None:
        if rdzv_install.compat_agent_api() is not None:  # NVRx 0.4/0.5: this node's line in resctl's round
            owned_rdzv.before_round(worker_group.spec.rdzv_handler, worker_group)
        super()._rendezvous(worker_group)
        self.shared = self._share_store(worker_group.store)

    def _share_and_gather(self, store: Any, group_rank: int, group_world_size: int, spec: Any) -> Any:
        """NVRx 0.4/0.5: every node's local world size from resctl's round outcome, not N store keys."""
        api = rdzv_install.compat_agent_api()
        infos = None if api is None else owned_rdzv.gathered(spec.rdzv_handler, spec, group_world_size,
                                                             api._RoleInstanceInfo)
        return infos if infos is not None else super()._share_and_gather(store, group_rank, group_world_size, spec)

    def _start_workers(self, worker_group: Any) -> Any:
        self.before_start(worker_group)
        started = super()._start_workers(worker_group)
        self.after_start()
        return started

    def before_start(self, worker_group: Any) -> None:
        """Before a cycle's workers start: the health gate may stop the launcher; a job stop that
        came during the restart goes to the new workers; last cycle's stop marks go."""
        before_cycle(self)  # resctl.health.gate: may stop the launcher before this cycle's workers start
        if self.starts == 0 and hasattr(nvrx.LocalElasticAgent, "_wait_for_gpu_memory_reclaim"):
            self._gpu_baseline = gpu_reclaim.baseline(gpu_reclaim.nvml_reader(), worker_group.spec.local_world_size)
        if self.job_stop.signum is not None and self.job_stop.inside_run:
            # The new workers begin the job stop (and its final save) themselves, once their shim
            # can act on it: a SIGTERM now would reach none.
            os.environ[stop.JOB_STOP_ENV] = str(self.job_stop.signum)
            self.job_stop.deadline = time.monotonic() + self.term_timeout()
        if self.stop_file is not None:
            stop.clear(self.stop_file)
            stop.clear_left(self.stop_file)
        LatePreload.before_fork()
        self.starts += 1
        log.info("%s %d", STARTING_WORKERS, self.starts)  # the last line before the fork (tests find phases by it)

    def after_start(self) -> None:
        """The workers run: the agent's hold on their process context, and on the stop signals."""
        self._seams = _ProcessContextSeams(self, self._pcontext)
        self._own_groups()
        self._own_stop_signals()
        LatePreload.workers_started(len(self.live_pids()))
        Standbys.workers_started()  # for the next start, beside these workers
        self._looked = True  # a worker that ends before the first sleep ends it (`sleep_until_exit`)

    def _own_groups(self) -> None:
        """Each forked worker in a process group of its own from the parent's side too: the worker makes it
        in its at-fork hook, which may not have run when NVRx 0.6+ records the workers' groups right after the
        start (the launcher's group then, which its leftover cleanup skips: a worker's DataLoader children
        would outlive a stop). An exec'd worker leads its own session already (EPERM: nothing to do)."""
        groups = set()
        for pid in self._pcontext.pids().values() if self._pcontext is not None else ():
            try:
                os.setpgid(pid, pid)
            except OSError:
                pass
            try:
                groups.add(os.getpgid(pid))
            except OSError:  # gone already
                continue
        if hasattr(self, "_children_pgids"):
            self._children_pgids = groups

    def _assign_worker_ranks(self, *args: Any, **kwargs: Any) -> Any:
        if self._identical is None:
            return super()._assign_worker_ranks(*args, **kwargs)
        os.environ[IDENTICAL_ENV] = self._identical
        try:
            return super()._assign_worker_ranks(*args, **kwargs)
        finally:
            del os.environ[IDENTICAL_ENV]

    def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
        # The last look at the workers' environment before they start (NVRx 0.4 and 0.7 alike).
        if self.shared.port is not None:
            for env in envs.values():
                env.update({"MASTER_ADDR": self.shared.host, "MASTER_PORT": self.shared.port,
                            contract.AGENT_STORE: "True", contract.STORE_PREFIX: self.shared.prefix})
        self.restart_clock.hand_to(envs.values())
        super()._setup_local_watchdog(envs)

    def _stop_workers(self, worker_group: Any, *args: Any, **kwargs: Any) -> Any:
        self.mark_restart(self.live_pids())
        self.restart_clock.stopping()
        try:
            return super()._stop_workers(worker_group, *args, **kwargs)
        finally:
            self.restart_clock.stopped()

    def _wait_for_gpu_memory_reclaim(self, num_gpus: int) -> None:
        """NVRx 0.6+, after a restart's stop: the memory the stopped workers held, measured from each GPU's use
        before the first workers (`resctl.launch.gpu_reclaim`: NVRx's absolute 512 MB made every restart on an
        H200 wait its whole 50 s); NVRx's own wait where there is no baseline."""
        cfg, base = getattr(self, "_ft_cfg", None), self._gpu_baseline
        read = gpu_reclaim.nvml_reader() if base else None
        if cfg is None or base is None or read is None:
            super()._wait_for_gpu_memory_reclaim(num_gpus)
            return
        waited = gpu_reclaim.wait(read, base, float(cfg.gpu_memory_tolerance_mb), float(cfg.gpu_memory_reclaim_timeout))
        if waited is None:
            log.warning("GPU memory not back within %.0f MB of its use before the first workers after %.0f s; "
                        "starting the workers anyway", cfg.gpu_memory_tolerance_mb, cfg.gpu_memory_reclaim_timeout)
        else:
            log.info("GPU memory reclaimed in %.2f s (within %.0f MB of its use before the first workers)", waited,
                     cfg.gpu_memory_tolerance_mb)

    def _monitor_workers(self, worker_group: Any) -> Any:
        result = super()._monitor_workers(worker_group)
        state = getattr(result.state, "name", "")
        if state in ("FAILED", "UNHEALTHY"):
            self.restart_clock.failed()
        elif state == "SUCCEEDED":
            LatePreload.abandon()  # no fork after this: the end need not share the GIL with the import
        self._looked = True  # the next sleep ends on a worker that exits after this look (`sleep_until_exit`)
        if (self.job_stop.signum is None and state in ("FAILED", "UNHEALTHY") and self._left_on_a_peers_stop()
                and spares.decide_after_peer_stop(self)):
            self.job_stop.signum, self.job_stop.deadline, self.job_stop.peer = signal.SIGTERM, time.monotonic(), True
            raise self.job_stop.exception()  # before NVRx's restart: this launcher stops as for its own SIGTERM
        return result

    def _restart_workers(self, worker_group: Any) -> Any:
        if self.job_stop.signum is not None and self.job_stop.deadline is not None:
            raise self.job_stop.exception()  # the workers left on the job stop: end the job, no restart
        self.job_stop.restarting = True
        try:
            self._to_the_open_round()
            return super()._restart_workers(worker_group)
        finally:
            self.job_stop.restarting = False

    def _to_the_open_round(self) -> None:
        """NVRx 0.6+'s barrier rendezvous: a node that restarts knows its round as the one that just
        ended (closed) until a rate-limited scan of the store moves it on, and polls every second
        meanwhile (`_wait_for_rendezvous_open`): a second on every restart. The next round is open by
        now (this node or a peer opened it before the restart), so the scan is made here, once."""
        state = getattr(getattr(self, "_rdzv_handler", None), "_barrier_state", None)
        sync = getattr(state, "_sync_from_per_round_state", None)
        if sync is not None:
            try:
                sync()
            except Exception:  # noqa: BLE001 - NVRx's own wait scans again
                pass

    def _shutdown(self, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        if not _leftovers_wait_for_members():
            super()._shutdown(death_sig, timeout)
            return
        # NVRx 0.6+'s own `_shutdown`, less the fixed 1 s its leftover cleanup sleeps on every stop.
        watchdog = getattr(self, "_worker_watchdog", None)
        if watchdog is not None:
            watchdog.stop()
            self._worker_watchdog = None
        if self._pcontext:
            self._pcontext.close(death_sig, timeout=timeout)
            terminate_leftovers(self._children_pgids)

    def shutdown_rank_monitors(self) -> None:
        super().shutdown_rank_monitors()
        self._say_done()

    # -- the launcher's clock ---------------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        """Every sleep of NVRx's launcher module: while workers run, until one exits; after the run,
        on the store host, until the other nodes are done with the store."""
        if self.finished:
            self._wait_for_peers(seconds)
            return
        self.job_stop.check()
        LatePreload.maybe_start()
        trace = [self.job_stop.trace.fd] if self.job_stop.trace.fd >= 0 else []
        after_look, self._looked = self._looked, False
        pids = self.live_pids()
        # Only a sleep beside running workers (the monitor's) looks for the late preload's note more often; NVRx's
        # other sleeps (its barriers count down by the time asked) are kept whole.
        wait = LatePreload.look_within(seconds) if pids else seconds
        sleep_until_exit(pids, self.result_fds() + trace, wait, after_look=after_look)

    # -- inside --------------------------------------------------------------------------------------

    def _share_store(self, store: Any) -> SharedStore:
        tcp = _tcp_store(store)
        if tcp is None:
            return SharedStore()
        # One key space per rendezvous round, the same on every node: the first agent of the round
        # to get here names it (`store` is this round's). A restart count would not do: a replaced
        # node's launcher counts from 0 again while the others are at 1.
        token = store.compare_set(_ROUND_KEY, "", uuid.uuid4().hex)
        prefix = f"/worker/{token.decode() if isinstance(token, bytes) else token}"
        return SharedStore(str(tcp.host), str(tcp.port), prefix)

    def _own_stop_signals(self) -> None:
        """The stop signals torch elastic's handler took when the workers started are the agent's:
        remembered, then handled as torch would (a `SignalException`) unless a restart is under way."""
        handler = elastic_api._terminate_process_handler
        for name in _STOP_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None and signal.getsignal(sig) is handler:
                signal.signal(sig, self._on_stop_signal)

    def _on_stop_signal(self, signum: int, frame: Any) -> None:
        if self.job_stop.signum is not None:
            # The stop is under way (raised, or handed to new workers): a second signal raised inside the
            # shutdown's own work (a log record being written: "--- Logging error ---" and a traceback on the
            # console, seen in CI) and cut it short. `resctl run` SIGKILLs after --term-timeout anyway.
            return
        self.job_stop.signum = signum
        if not self.job_stop.restarting:
            elastic_api._terminate_process_handler(signum, frame)  # raises SignalException

    def _left_on_a_peers_stop(self) -> bool:
        """This launcher's workers all left on another node's job stop (none on a SIGTERM of its own)."""
        return self.stop_file is not None and stop.left(self.stop_file) == {stop.PEER}

    def _say_done(self) -> None:
        """Another node than the store host: it will read the store no more."""
        store = getattr(self._worker_group, "store", None)
        if store is None or getattr(self, "_is_store_host", False):
            return
        try:
            store.add(_DONE_KEY, 1)
        except Exception:  # noqa: BLE001 - the store host gone already: nothing to wait for
            pass

    def _spares_reading(self) -> bool:
        """Spares may still read the store. resctl's rendezvous says whether a live one waits (whatever
        launch.nnodes' maximum: a spare waits for a full round too; one lost the store in CI when the host
        went on that), and a spare that saw the close marks itself gone; another rendezvous: launch.nnodes'
        maximum is above the last round's size."""
        handler = spares.handler_of(self)
        if isinstance(handler, RendezvousView):
            try:
                return bool(handler.state().spares)
            except Exception:  # noqa: BLE001 - the store is this process's: unreadable, no one reads it
                return False
        max_nodes = getattr(getattr(handler, "_settings", None), "max_nodes", None)
        return not isinstance(max_nodes, int) or max_nodes > (self._worker_group.group_world_size or 1)

    def _peers_done(self) -> bool:
        """The other nodes of the last round said they are done with the store (`_say_done`)."""
        store, peers = getattr(self._worker_group, "store", None), (self._worker_group.group_world_size or 1) - 1
        if peers <= 0 or store is None:
            return True
        try:
            return int(store.add(_DONE_KEY, 0)) >= peers
        except Exception:  # noqa: BLE001 - the store is ours; a failure means there is no one to wait for
            return True

    def _wait_for_peers(self, seconds: float) -> None:
        """Until the other nodes of the last round are done and no spare still reads the store, `seconds` at most."""
        deadline = time.monotonic() + seconds
        while not (self._peers_done() and not self._spares_reading()) and time.monotonic() < deadline:
            time.sleep(0.05)


def install(patches: Patches) -> Callable[[], ResctlAgent | None]:
    """Make `ResctlAgent` the agent ft_launcher builds, and its clock the one NVRx's launcher sleeps
    on; returns how to find the agent once the launcher has built it."""
    clock = LauncherClock(nvrx.time)
    ResctlAgent.user_identical = os.environ.get(IDENTICAL_ENV)  # before NVRx's launcher sets it
    patches.set(nvrx, "LocalElasticAgent", ResctlAgent)
    patches.set(nvrx, "time", clock)
    return lambda: clock.agent
