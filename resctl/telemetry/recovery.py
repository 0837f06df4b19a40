"""One recovery of a run: the fault that started it and its phases, from the two epochs on either side
(definitions: `resctl.telemetry.goodput`'s docstring). Pure functions of `epochs.Epoch`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from resctl.telemetry.epochs import Epoch

NO_FAULT_EVENT = "unrecorded"  # cause when no rank left any sign of what failed
KILLED = "killed"  # a rank ended without a record: a signal, the OOM killer, a heartbeat timeout
#: Errors a rank sees when a *peer* failed: secondary to that peer's fault.
PEER_ERROR = re.compile(r"closed by peer|connection reset|broken pipe|DistBackendError|DistNetworkError|"
                        r"DistStoreError|RankShouldRestart|ProcessGroup(Gloo|NCCL)|NCCL (error|communicator)|"
                        r"\[gloo|gloo/transport", re.IGNORECASE)


@dataclass(frozen=True)
class Recovery:
    """One fault and the recovery that followed it (times in seconds)."""

    layer: str  # "launcher" or "inprocess"
    cause: str
    rank: int | None  # rank that failed (None when nothing says which)
    t_fault: float  # seconds since run start
    detection: float
    restart: float
    load: float
    first_step: float | None  # None: the new epoch never made a step
    total: float | None
    last_step: int  # highest step reached before the fault
    resumed_step: int
    rollback_steps: int
    injected: bool
    tier: str | None = None  # where the resumed state came from (ckpt_load): memory, buddy, disk; "+" joins several
    stop: float | None = None  # phases of `restart` (module docstring): the old workers gone
    rendezvous: float | None = None  # ... the launchers' rendezvous (in-process: the wrapper's barrier)
    start_workers: float | None = None  # ... first worker process created to the last rank's start


#: The phases a recovery's total splits into, in order, with the words every report uses for them
#: (the module docstring defines each; stop + rendezvous + start workers = restart). The text
#: report, the HTML page and `recovery_stats` (a key each) read them from here.
RECOVERY_PHASES: tuple[tuple[str, str], ...] = (
    ("detection", "detect"), ("stop", "stop"), ("rendezvous", "rendezvous"), ("start_workers", "start workers"),
    ("load", "restore"), ("first_step", "first step"),
)
#: The rows of the recovery statistics: the total first, the restart after its three parts.
RECOVERY_STATS: tuple[tuple[str, str], ...] = (
    ("total", "total (fault -> first step)"), *RECOVERY_PHASES[:4],
    ("restart", "restart (stop + rendezvous + start)"), *RECOVERY_PHASES[4:],
)


def primary(old: Epoch, launcher: bool) -> tuple[str, int | None, bool, float | None]:
    """(cause, rank, injected, t) of the fault that started a recovery (see the module docstring)."""
    faults = [f for f in old.faults if f["cause"] != "sigterm"]
    injected = [f for f in faults if f["injected"]]
    peer = [f for f in faults if not f["injected"] and f["cause"] == "exception"
            and PEER_ERROR.search(f["error"] or "")]
    own = [f for f in faults if not f["injected"] and f not in peer]
    for group in (injected, own):
        if group:
            first = min(group, key=lambda f: f["t"])
            return first["cause"], first["rank"], bool(first["injected"]), first["t"]
    silent = sorted((t, r) for r, t in old.last_by_rank.items() if r not in old.terminal) if launcher else []
    if silent:
        return KILLED, silent[0][1], False, silent[0][0]
    rest = peer or [f for f in old.faults if f["cause"] == "sigterm"]
    if rest:
        first = min(rest, key=lambda f: f["t"])
        return first["cause"], first["rank"], bool(first["injected"]), first["t"]
    return NO_FAULT_EVENT, None, False, None


def recovery(old: Epoch, new: Epoch, t0: float) -> Recovery:
    launcher = new.key[0] != old.key[0]
    cause, rank, injected, t_fault = primary(old, launcher)
    last_step = old.max_step or 0
    if t_fault is None:
        t_fault = old.last_step_t if old.last_step_t is not None else old.last_t
    if launcher:
        stops = [t for t, r in old.stops if t >= t_fault and r != rank]
        t_detect = min(stops) if stops else max(t_fault, old.last_t)
        t_restarted = new.start_max if new.start_max is not None else t_detect
        if new.detected_min is not None:  # the launchers' own clock of the restart (start's detected, stopped)
            t_detect = min(max(new.detected_min, t_fault), t_restarted)
        t_stopped = min(max(old.last_t, t_detect), t_restarted)
        if new.stopped_max is not None:
            t_stopped = min(max(new.stopped_max, t_detect), t_restarted)
        stop: float | None = max(0.0, t_stopped - t_detect)
        # `spawned` is clock ticks: never before the stop, never after the last start.
        t_spawned = None if new.spawned_min is None else min(max(new.spawned_min, t_stopped), t_restarted)
        rendezvous: float | None = max(0.0, (t_spawned if t_spawned is not None else t_restarted) - t_stopped)
        start_workers = None if t_spawned is None else max(0.0, t_restarted - t_spawned)
    else:
        t_detect = new.restart_min if new.restart_min is not None else new.first_t
        t_restarted = new.restart_max if new.restart_max is not None else t_detect
        stop, rendezvous, start_workers = None, max(0.0, t_restarted - t_detect), None
    t_loaded = max(new.resume_max_t if new.resume_max_t is not None else t_restarted, t_restarted)
    t_first = max(new.first_step_t.values()) if new.first_step_t else None
    if new.resume_min_step is not None:
        resumed = new.resume_min_step
    else:
        resumed = new.min_step - 1 if new.min_step is not None else 0
    return Recovery(
        layer="launcher" if launcher else "inprocess", cause=cause, rank=rank, t_fault=t_fault - t0,
        detection=max(0.0, t_detect - t_fault),
        restart=max(0.0, t_restarted - t_detect),
        load=max(0.0, t_loaded - t_restarted),
        first_step=None if t_first is None else max(0.0, t_first - t_loaded),
        total=None if t_first is None else t_first - t_fault,
        last_step=last_step, resumed_step=resumed, rollback_steps=max(0, last_step - resumed),
        injected=injected, tier="+".join(sorted(new.load_tiers)) or None,
        stop=stop, rendezvous=rendezvous, start_workers=start_workers,
    )
