"""The entry shim: gives an unmodified PyTorch script heartbeats, events, fault drills,
checkpoint configuration, preemption handling and (when enabled) in-process restart.

What it does in each worker, in order:

1. reads the plan `resctl run` wrote (`RESCTL_PLAN`): the resolved profile and run directory;
2. opens `events-rank<R>.jsonl` and records `start`;
3. installs a global optimizer step hook: every `optimizer.step()` is a heartbeat to the NVRx
   rank monitor, a `step` event and the clock of fault drills;
4. patches `torch.distributed.init_process_group` so the NVRx `RankMonitorClient` connects once
   the script's process group exists (a script with its own client keeps it: the shim stands down);
5. configures `resctl.checkpoint` from the profile (and `intercept_torch_save`);
6. runs the script as `__main__` (runpy), inside NVRx `inprocess.Wrapper` when enabled.

The worker ends as `python script.py` would (`resctl.shim.ending`); a forked worker first gets
a new interpreter's state back (`resctl.shim.forked`). Children started with spawn or
forkserver re-import the script as `__mp_main__`, as under torchrun (so they find its functions).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from resctl import checkpoint, console
from resctl.checkpoint import memdir
from resctl.checkpoint.errors import CheckpointDirInUse, CheckpointMismatch, SaveFailuresExceeded
from resctl.drills import KINDS, FaultKind
from resctl.errors import EXIT_USAGE
from resctl.launch import stop
from resctl.launch.preload import LatePreload
from resctl.patching import Patches
from resctl.profile import contract
from resctl.profile.schema import Profile
from resctl.shim import agent_store, busy, dcpsaves, ending, fork_env, forked, on_import, snapshots
from resctl.shim.busy import BusyClock
from resctl.shim.faults import FaultPlan, InjectedFault
from resctl.shim.signals import SigtermWatcher
from resctl.shim.stopstep import ANY_STEP, StopStep, StopStepUnavailable, open_for_default_group
from resctl.shim.target import Target, parse_argv, run_target
from resctl.telemetry.events import EventLog, host, process_started

if TYPE_CHECKING:  # the engine imports torch; the shim loads it in _configure_checkpoint
    from resctl.checkpoint.engine import Checkpointer

EXIT_SIGTERM = 143
OUTLAST = 10.0  # seconds rank 0 (the store's host) waits at a clean end for the other ranks to close
PING_EVERY = 0.1  # seconds between progress pings to the in-process wrapper (rate limit)
BEAT_EVERY = 1.0  # seconds between step heartbeats at most (rate limit); less for short timeouts


def beat_interval(timeout: float | None) -> float:
    """Seconds between step heartbeats: `BEAT_EVERY`, or an eighth of a shorter heartbeat timeout
    (a hang is still seen within the timeout plus this)."""
    return BEAT_EVERY if timeout is None else min(BEAT_EVERY, timeout / 8)


def load_plan(env: dict[str, str] | os._Environ[str]) -> tuple[Profile, Path | None]:
    handed = contract.Handed.of(env)
    if handed.plan is None:
        return Profile(), handed.run_dir
    data = json.loads(handed.plan.read_text(encoding="utf-8"))
    return Profile.model_validate(data["profile"]), Path(data["run_dir"])


class Heartbeats:
    """The shim's NVRx RankMonitorClient; stands down when the script brings its own."""

    def __init__(self, events: EventLog) -> None:
        self.events = events
        self.client: Any = None
        self.user_owns = False
        self._own: Any = None
        self._warned = False
        self._lock = threading.RLock()

    @property
    def available(self) -> bool:
        return bool(os.environ.get("FT_RANK_MONITOR_IPC_SOCKET"))

    def connect(self) -> None:
        if not self.available or self.user_owns or self.client is not None:
            return
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        with self._lock:
            self._own = client = RankMonitorClient()
            client.init_workload_monitoring()
            self.client = client

    def is_own(self, client: Any) -> bool:
        return client is self._own

    def beat(self) -> None:
        """Send a heartbeat; a lost monitor connection is reported once, never raised into the
        training step (the launcher notices a dead monitor itself)."""
        client = self.client
        if client is None:
            return
        with self._lock:
            try:
                client.send_heartbeat()
            except Exception as err:  # noqa: BLE001
                if not self._warned:
                    self._warned = True
                    console.line(f"resctl: heartbeat to the rank monitor failed: {err}")

    def yield_to_user(self) -> None:
        with self._lock:
            self.user_owns = True
            if self.client is not None:
                self.client.shutdown_workload_monitoring()
                self.client = None

    def close(self) -> None:
        with self._lock:
            if self.client is not None:
                try:
                    self.client.shutdown_workload_monitoring()
                except Exception:  # noqa: BLE001 - the monitor may be gone already at exit
                    pass
                self.client = None


class Shim:
    def __init__(self, profile: Profile, run_dir: Path | None, env: Any = os.environ, *, forked: bool = False) -> None:
        self.profile = profile
        self.run_dir = run_dir
        self.forked = forked  # forked from the launcher (`forked.is_forked_worker` before `forked.reset`)
        self.rank = int(env.get("RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.cycle = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.events = EventLog(run_dir, self.rank, self.cycle)
        self.heartbeats = Heartbeats(self.events)
        self.faults = FaultPlan([f.model_dump() for f in profile.faults.schedule], self.rank, run_dir)
        self.step = 0
        self.step_epoch: tuple[int, int] | None = None  # (cycle, iteration) of the last optimizer step
        #: False while a library steps an optimizer that is not training (DCP's zero-learning-rate step that
        #: makes a fresh optimizer's state before a load: shim/dcpsaves.py): that step is not counted.
        self.counting_steps = True
        self._last_step_t = time.monotonic()
        self.sigterm_at: float | None = None
        #: The engine, once `_configure_checkpoint` made it; the shim is its `Hooks` (heartbeat,
        #: loaded, final_gate, after_final: resctl.checkpoint.hooks).
        self.checkpointer: Checkpointer | None = None
        #: The job's stop-step agreement over the script's process group (None: this rank stops alone).
        self.stop_step: StopStep | None = None
        self._stopping = False  # a stop at a step boundary is under way (by SIGTERM or a peer)
        self.sigterm_watcher = SigtermWatcher(self.on_restart_stop, self.on_sigterm)
        self._stop_deadline = 0.0
        self._stop_at: int | None = None  # the agreed stop step, once known
        self._stop_lock = threading.Lock()
        self._leaving = threading.Lock()
        #: The in-process wrapper's progress ping for the running iteration (None without one).
        self.progress: Callable[[], None] | None = None
        self._last_ping = 0.0
        #: Seconds between the heartbeats of optimizer steps: often enough for any timeout, rarely
        #: enough that their round trip to the rank monitor is no per-step cost.
        self.beat_every = beat_interval(profile.heartbeat.timeout)
        self._next_beat = 0.0  # the first step beats at once (it ends the initial timeout)
        self._late_noted = False  # the launcher was told whether the script imported its late preload
        #: Every change the shim makes to torch, NVRx and the standard library; `undo()` reverts them.
        self.patches = Patches("shim")
        #: Each step's own work outside its collectives' waits (the straggler detector's measure in a synchronous job).
        self.busy = BusyClock()
        self._busy_off: Callable[[], None] | None = None

    # -- hooks -------------------------------------------------------------------------------
    def on_optimizer_step(self, *_: Any) -> None:
        """Every optimizer step: a `step` event (batched in memory, `EventLog.step`), and at most
        every `beat_every` a heartbeat (a round trip to the rank monitor) and every `PING_EVERY` a
        progress ping; so a step costs microseconds however short it is (bench/bench_shim_step.py)."""
        if not self.counting_steps:
            return
        self.step += 1
        now = time.monotonic()
        if self._busy_off is not None:  # every DDP module has had its first forward: no global pre-hook from now
            off, self._busy_off = self._busy_off, None
            off()
        events = self.events
        self.step_epoch = (events.cycle, events.iteration)
        events.step(self.step, now - self._last_step_t, self.busy.boundary(now))
        self._last_step_t = now
        if now >= self._next_beat:
            self._next_beat = now + self.beat_every
            if self.heartbeats.client is None:
                self.heartbeats.connect()
            self.heartbeats.beat()
            if not self._late_noted:
                self._note_late_imports()
        if self.progress is not None:
            self.ping()
        if self.faults:
            self.fire_faults(self.step)

    def _note_late_imports(self) -> None:
        """Once, at the first step: a forked worker tells its launcher when the script imported what the
        launcher imports late for restarted workers (`resctl.launch.preload.LatePreload`); an exec'd one that it
        stepped (its script imports torch: a restarted worker may start in a standby, `resctl.launch.standby`)."""
        self._late_noted = True
        if self.forked:
            LatePreload.note_imported()
        else:
            stop.mark_stepped(os.environ)

    def ping(self) -> None:
        """Tell the in-process wrapper's progress watchdog that training is progressing."""
        progress = self.progress
        now = time.monotonic()
        # Each ping is a message to the NVRx monitor process; a few per second are plenty.
        if progress is not None and now - self._last_ping >= PING_EVERY:
            self._last_ping = now
            try:
                progress()
            except Exception:  # noqa: BLE001 - the wrapper may be between iterations; progress is best effort
                pass

    def set_progress(self, ping: Callable[[], None] | None) -> None:
        """Install (or clear) the progress ping of the running in-process iteration; its first
        step pings at once, which starts NVRx's manual progress timeout for the iteration."""
        self.progress = ping
        self._last_ping = 0.0
        if ping is not None:  # an iteration (re)starts: the rank monitor hears of it now, and of its first step
            self._next_beat = 0.0
            self.heartbeats.beat()

    def heartbeat(self) -> None:
        """The engine's heartbeat (`Hooks`): before/after saves, during long writes and reads."""
        self.heartbeats.beat()
        self.ping()

    def settle_checkpoint(self) -> None:
        """After an in-process fault: let the previous iteration's write finish; a failed one was
        never published, so it is only reported (the script's `load` takes the newest valid one)."""
        data = sys.modules.get("resctl.checkpoint.dataposition")
        if data is not None:  # the script's next run has its own loaders
            data.REGISTRY.reset()
        if self.checkpointer is None:
            return
        try:
            self.checkpointer.wait()
        except Exception as err:  # noqa: BLE001 - CheckpointError: nothing to undo
            console.line(f"resctl: after restart: {err}")

    def fire_faults(self, step: int) -> None:
        """Fire the drills due at `step` on this rank (each once per run), in `KINDS` order."""
        for kind in KINDS:
            if not self.faults.take(step, kind):
                continue
            self.events.emit("fault", cause=kind, injected=True, step=step, error=f"injected {kind} at step {step}")
            console.line(f"resctl: FAULT DRILL: injecting {kind} at step {step} on rank {self.rank}")
            DRILL_ACTIONS[kind](self, step)

    def hang(self) -> None:
        """The `hang` drill: stop making optimizer steps forever, in short sleeps.

        Both layers see it. The launcher's rank monitor gets no heartbeat (they come from optimizer
        steps) and kills the rank after `heartbeat.timeout`. NVRx's progress watchdog gets no ping
        (also per optimizer step), so `inprocess.soft_timeout` fires; because the main thread keeps
        returning to the interpreter between sleeps, the wrapper's asynchronous RankShouldRestart is
        delivered at once and the rank restarts in-process. One long `time.sleep()` would also stop
        the watchdog's automatic timestamps, but could not be interrupted before `hard_timeout`,
        which kills the process (see docs/recovery.md).
        """
        while True:
            time.sleep(0.05)

    def on_resume(self, step: int, load_seconds: float = 0.0, **detail: Any) -> None:
        self.step = step
        self._last_step_t = self.busy.start = time.monotonic()  # the first step's duration excludes start-up and load
        self._next_beat = 0.0  # the first step after a resume beats at once
        self.events.emit("resume", step=step, load_seconds=round(load_seconds, 6), **detail)
        # A job stop the launcher handed over begins once the state is loaded: its final save needs it.
        self.sigterm_watcher.stop_if_asked()

    def on_restart_stop(self) -> None:
        """The launcher is stopping this worker to restart the group: a peer failed, so no
        collective will complete and no final checkpoint can be made. Leave now, unless the script has
        ended already: its last words (an exit message, a traceback, a thread's or atexit's output)
        are on their way to the console, and the launcher's stop timeout still bounds the wait."""
        if ending.over.is_set():
            return
        self.events.emit("end", status="restart-stop", step=self.step)
        os._exit(EXIT_SIGTERM)

    def on_sigterm(self) -> None:
        """A stop of the job (preemption, pod deletion, scancel): final checkpoint, then exit 143."""
        self.sigterm_at = time.monotonic()
        self.events.emit("fault", cause="sigterm", injected=False, step=self.step, error="SIGTERM received")
        _mark_left(peer=False)
        if self.stops_at_boundary:
            # Save at a step boundary (maybe_save) so the state is never torn: the stop step all
            # ranks agree on (resctl/shim/stopstep.py). A script that never called maybe_save has
            # no boundary to wait for: it exits below.
            self.stop_at_boundary(self.sigterm_at)
            return
        self._propose_any_step(wait=1.0)
        ckpt = self.checkpointer
        if ckpt is not None:
            try:
                ckpt.wait()  # the in-flight write (intercepted torch.save included) lands first
            except Exception as err:  # noqa: BLE001 - a failed write was never published; exit anyway
                console.line(f"resctl: on SIGTERM: {err}")
        self.leave("sigterm")

    def _propose_any_step(self, wait: float) -> None:
        """A rank with no step boundary to stop at (its script never called maybe_save, as when only
        rank 0 saves) proposes "any step", so that the ranks that do save need not wait for it."""
        coordinator = self.stop_step
        if coordinator is not None and coordinator.claim():
            threading.Thread(target=coordinator.propose, args=(ANY_STEP,), name="resctl-stop-propose",
                             daemon=True).start()
            coordinator.proposed.wait(wait)

    @property
    def stops_at_boundary(self) -> bool:
        ckpt = self.checkpointer
        return ckpt is not None and self.profile.checkpoint.save_on_sigterm and ckpt.tracks_state

    def on_peer_stop(self) -> None:
        """Another rank proposed a stop step (the stop-step thread): stop with it (and tell the launcher,
        which received no stop: resctl/launch/spares.py decides whether the job goes on without that node)."""
        if self.sigterm_at is None:
            _mark_left(peer=True)
        if self.stops_at_boundary:
            self.stop_at_boundary(time.monotonic())
        else:
            self._propose_any_step(wait=0)

    def stop_at_boundary(self, since: float) -> None:
        """Begin a stop at a step boundary (any thread, once): ask for the final save, propose this
        rank's stop step, and exit at the final save or, failing that, when the grace is over."""
        with self._stop_lock:
            if self._stopping:
                return
            self._stopping = True
        ckpt = self.checkpointer
        assert ckpt is not None  # only a rank that stops at a boundary (stops_at_boundary) gets here
        _mark_saving()  # a local peer that leaves first is no failure to the launcher while this one saves
        self._stop_deadline = since + self.profile.checkpoint.sigterm_grace
        ckpt.request_final_save(deadline=self._stop_deadline)
        # Read after the request: the training thread sees the request at this boundary + 1 or sooner.
        latest = ckpt.latest_step or 0
        coordinator = self.stop_step
        if coordinator is not None and coordinator.claim():
            # In a thread: this may run in the signal handler on the training thread.
            threading.Thread(target=coordinator.propose, args=(latest + 1,), name="resctl-stop-propose",
                             daemon=True).start()
        threading.Thread(target=self._exit_after_grace, daemon=True).start()

    def loaded(self, step: int, seconds: float) -> None:
        """The engine's `loaded` (`Hooks`): the script resumes at `step` (0: from the start)."""
        self.on_resume(step, load_seconds=seconds)

    def final_gate(self, step: int) -> bool:
        """The engine's `final_gate` (`Hooks`): is the final save due at this boundary?"""
        if self._stop_at is None:
            self._stop_at = self._agree(step)
        return step >= self._stop_at

    def _agree(self, step: int) -> int:
        coordinator = self.stop_step
        if coordinator is None:
            return step
        t0 = time.monotonic()
        try:
            agreed = coordinator.agree(timeout=max(0.0, self._stop_deadline - t0) / 2, tick=self.heartbeat)
            outcome, why = "agreed", {}
        except StopStepUnavailable as err:
            console.line(f"resctl: rank {self.rank}: saving at step {step} without the other ranks: {err}")
            agreed, outcome, why = step, "alone", {"why": str(err)}
        self.events.emit("stop", step=agreed, at=step, proposed=coordinator.proposal, outcome=outcome,
                         seconds=round(time.monotonic() - t0, 6), **why)
        return agreed

    def _exit_after_grace(self) -> None:
        # The training thread leaves at the final save (`after_final`); this leaves when the grace
        # period is over if the loop never gets there (after the in-flight write lands).
        remaining = max(0.0, self._stop_deadline - time.monotonic())
        ckpt = self.checkpointer
        assert ckpt is not None  # started by stop_at_boundary
        if ckpt.final_done.wait(remaining):
            return
        try:
            ckpt.wait()
        finally:
            self.leave("sigterm")

    def after_final(self) -> None:
        """The engine's `after_final` (`Hooks`): the final save is over; training must not go past it."""
        try:
            if self.checkpointer is not None:
                self.checkpointer.wait()
        finally:
            self.leave("sigterm")

    def leave(self, status: str) -> None:
        """Record the end and exit 143 now (once: a second caller waits for the exit)."""
        with self._leaving:
            self.finish(status)
            os._exit(EXIT_SIGTERM)

    def finish(self, status: str) -> None:
        dcpsaves.settle()  # the script's own async DCP saves that are durable, before the end
        self.events.emit("end", status=status, step=self.step)
        self.heartbeats.close()  # first: a wait below must not read as a hung rank
        if self.stop_step is not None and status != "sigterm":  # a stopping rank's wait has ended already
            self.stop_step.close()
            if status == "ok":
                self.stop_step.outlast(OUTLAST)  # where rank 0 hosts the store the others still wait on
        elif self.stop_step is not None:  # the others may not have read the stop step from rank 0's store yet
            self.stop_step.outlast_agreement(min(OUTLAST, max(0.0, self._stop_deadline - time.monotonic())))
        if self.checkpointer is not None:
            self.checkpointer.drop_recycled()  # no write of this process will reuse it
        if status == "ok" and self.checkpointer is not None and not os.environ.get(memdir.LAUNCH_ENV):
            # A clean end without `resctl run`: nobody else removes this rank's snapshots. Under
            # `resctl run` they stay until the job as a whole is done (its backstop removes them):
            # a peer killed after this rank finished restarts the group, and this rank's state must
            # still be there (issue 27).
            self.checkpointer.release_memory()

    # -- installation ----------------------------------------------------------------------
    def install(self) -> None:
        """Hook into torch, NVRx and the process; every change is in `self.patches` (undoable).
        Main thread only (signal handling). An exec'd worker whose interpreter has no torch yet gets torch's
        hooks when the script imports it (`resctl.shim.on_import`): a script that never does starts without
        it, as under torchrun (~1.7 CPU-s a worker)."""
        if not self._torch_now():
            self.sigterm_watcher.install(self.patches)
            on_import.after_import("torch", lambda _torch: self._install_torch(), self.patches)
            return
        self._install_torch()
        self.sigterm_watcher.install(self.patches)
        if not (self.checkpointer is not None and self.profile.checkpoint.save_on_sigterm):
            self.sigterm_watcher.stop_if_asked()  # no final save to make: a handed-over stop leaves now

    def _torch_now(self) -> bool:
        """Install torch's hooks before the script starts: torch is imported already (a forked worker: the
        launcher's), the in-process wrapper runs the script (NVRx imports torch), or the launcher handed a job
        stop over (the final save's engine must be there when it begins)."""
        return "torch" in sys.modules or self.profile.inprocess.enabled or bool(os.environ.get(stop.JOB_STOP_ENV))

    def _install_torch(self) -> None:
        import torch.distributed as dist
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.patches.on_undo(register_optimizer_step_post_hook(self.on_optimizer_step).remove)
        if self.profile.health.stragglers:  # each rank's own work in a synchronous step (resctl.shim.busy)
            self._busy_off = busy.install(self.busy, self.patches)
        original_init = dist.init_process_group
        shim = self

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            result = original_init(*args, **kwargs)
            shim.heartbeats.connect()
            shim.open_stop_step()
            return result

        self.patches.set(dist, "init_process_group", init_process_group)
        agent_store.prefix_per_cycle(self.patches)  # a fresh key space per cycle in the launcher's store
        original_destroy = dist.destroy_process_group

        def destroy_process_group(group: Any = None) -> Any:
            if group is None and shim.stop_step is not None:
                shim.stop_step.close()  # before the store may go (rank 0's, where it hosts it)
            return original_destroy(group)

        self.patches.set(dist, "destroy_process_group", destroy_process_group)
        self._patch_user_rank_monitor()
        self._configure_checkpoint()
        snapshots.install(self)  # after the torch.save interceptor: sees intercepted saves too

    def open_stop_step(self) -> None:
        """A new process group: agree on stop steps through its store (the old group's is closed)."""
        if self.stop_step is not None:
            self.stop_step.close()
        self.stop_step = open_for_default_group()
        if self.stop_step is not None:
            self.stop_step.watch(self.on_peer_stop)
            if self._stopping and self.checkpointer is not None and self.stop_step.claim():
                # The stop began before this group existed (one the launcher handed over): propose now.
                threading.Thread(target=self.stop_step.propose, args=((self.checkpointer.latest_step or 0) + 1,),
                                 name="resctl-stop-propose", daemon=True).start()

    def uninstall(self) -> None:
        self.patches.undo()

    def _patch_user_rank_monitor(self) -> None:
        if not self.heartbeats.available:
            return
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        original = RankMonitorClient.init_workload_monitoring
        heartbeats = self.heartbeats

        def init_workload_monitoring(client: Any) -> None:
            if not heartbeats.is_own(client):
                heartbeats.yield_to_user()
            original(client)

        self.patches.set(RankMonitorClient, "init_workload_monitoring", init_workload_monitoring)

    def _configure_checkpoint(self) -> None:
        from resctl.checkpoint.engine import Checkpointer

        ckpt = Checkpointer(self.profile.checkpoint, events=self.events, hooks=self)
        self.checkpointer = checkpoint.set_default(ckpt)
        extras = None
        if self.profile.checkpoint.intercept_torch_save:
            from resctl.checkpoint import intercept

            intercept.install(self.profile.checkpoint.intercept_torch_save, ckpt.writes)
            self.patches.on_undo(intercept.uninstall)
            extras = intercept.EXTRAS  # the data position is saved beside every snapshot too
        if self.profile.checkpoint.data_position:  # every loader's position joins every checkpoint
            from resctl.checkpoint import dataposition

            self.patches.on_undo(dataposition.install_auto(self.events, extras))

    # -- running ---------------------------------------------------------------------------
    def run_target(self, target: Target) -> None:
        run_target(target)


def _drill_exception(shim: Shim, step: int) -> None:
    raise InjectedFault(f"resctl fault drill: exception at step {step} on rank {shim.rank}")


def _drill_sigkill(shim: Shim, step: int) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _drill_hang(shim: Shim, step: int) -> None:
    shim.hang()


def _drill_checkpoint_exception(shim: Shim, step: int) -> None:
    if shim.checkpointer is not None:
        shim.checkpointer.fail_next_write(f"resctl fault drill: checkpoint write failure at step {step}")


#: What each drill of the registry (`resctl.drills`) does in a worker.
DRILL_ACTIONS: dict[FaultKind, Callable[[Shim, int], None]] = {
    "exception": _drill_exception,
    "sigkill": _drill_sigkill,
    "hang": _drill_hang,
    "checkpoint_exception": _drill_checkpoint_exception,
}
assert set(DRILL_ACTIONS) == set(KINDS), "every drill in resctl.drills needs an action here"


def _mark_left(peer: bool) -> None:
    """Tell this worker's launcher that it left on a job stop: another rank's (peer) or its own SIGTERM."""
    stop.mark_left(os.environ, os.getpid(), stop.PEER if peer else stop.OWN)


def _mark_saving() -> None:
    """Tell this worker's launcher that it is saving the job stop's final checkpoint."""
    stop.mark_saving(os.environ, os.getpid())


def main(argv: list[str]) -> int:
    """Run the script in this worker; returns its exit status (a forked worker that did not end
    cleanly leaves the process here instead, `resctl.shim.ending`)."""
    forked_worker = forked.is_forked_worker()
    if forked_worker:
        forked.reset()  # what a new interpreter would have: logging, signals, atexit, RNGs, stdin
    else:
        forked.fresh_faulthandler()  # the shim's imports must not leave it on either
    fork_env.apply()  # a worker forked from the launcher: what torchrun's environment would give
    _die_with_launcher()
    target = parse_argv(argv)
    profile, run_dir = load_plan(os.environ)
    shim = Shim(profile, run_dir, forked=forked_worker)
    from resctl.launch.titles import set_title, worker_title

    set_title(worker_title(shim.rank, int(os.environ.get("LOCAL_RANK", "0")), os.path.basename(target.name)))
    clock = contract.restart_clock(os.environ)
    shim.events.emit("start", pid=os.getpid(), host=host(), world_size=shim.world_size, script=target.name,
                     spawned=process_started(), **(dict(zip(("detected", "stopped"), clock)) if clock else {}))
    if shim.cycle > 0:  # ft_launcher restarted the worker group (in-job restart)
        shim.events.emit("restart", layer="launcher")
    # A fault drill is said once, by the launcher at launch (launch/execute.py `_notes`), not again
    # by rank 0 after every restart.
    ended = ending.run(lambda: _run(shim, target))
    recorded = ending.run(lambda: _record(shim, ended))  # a failed final wait is an ending too
    ended = ended if not ended.clean or recorded.clean else recorded
    if forked_worker and ended.error is not None and not isinstance(ended.error, (SystemExit, KeyboardInterrupt)):
        forked.post_error(ended.error)
    return ending.leave(ended, forked=forked_worker)


def _run(shim: Shim, target: Target) -> None:
    shim.install()
    if shim.profile.inprocess.enabled:
        from resctl.shim.inprocess import run_wrapped

        run_wrapped(shim, target, on_fault=lambda err: stop_if_incurable(shim, err))
    else:
        shim.run_target(target)


def _record(shim: Shim, ended: ending.Ending) -> None:
    """The events and checkpoints of how the script ended."""
    err = ended.error
    if err is None or isinstance(err, SystemExit):
        if err is not None:
            shim.events.emit("fault", cause="exit", error=f"SystemExit({err.code!r})", step=shim.step)
        _finish_checkpoints(shim)
        shim.finish("ok" if ended.clean else "error")
        return
    if not isinstance(err, InjectedFault):  # an injected one was recorded when it fired
        shim.events.emit("fault", cause="exception", injected=False, step=shim.step,
                         error=f"{type(err).__name__}: {err}",
                         traceback="".join(traceback.format_exception(
                             type(err), err, ending.script_traceback(err.__traceback__), limit=-20)))
    shim.finish("error")
    stop_if_incurable(shim, err)


def _die_with_launcher() -> None:
    """A job stop (SIGTERM) when the launcher dies, for exec'd workers too (forked ones got it at fork):
    a worker whose launcher was SIGKILLed must not train on unsupervised."""
    from resctl.launch import lifeline

    launcher = lifeline.expected(os.environ, lifeline.LAUNCHER_PID_ENV)
    if launcher is not None and os.getppid() in (launcher, 1):  # not a process this launcher started: leave it
        lifeline.die_with_parent(signal.SIGTERM, launcher)


def stop_if_incurable(shim: Shim, err: BaseException) -> None:
    """A checkpoint error no restart can cure stops the job (docs/recovery.md, "Faults no restart cures")."""
    if isinstance(err, (CheckpointDirInUse, CheckpointMismatch)):
        stop.stop_job(shim.run_dir, shim.rank, err, EXIT_USAGE)
    elif isinstance(err, SaveFailuresExceeded):
        stop.stop_job(shim.run_dir, shim.rank, err, 1)


def _finish_checkpoints(shim: Shim) -> None:
    if shim.checkpointer is not None:
        shim.checkpointer.wait()
