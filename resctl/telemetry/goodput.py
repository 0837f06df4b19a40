"""Goodput, recovery and calibration numbers computed from a run's events.

`analyze(events, plan)` turns the records of `events-rank*.jsonl` (see `resctl.telemetry.events`)
into a `RunAnalysis`; `resctl report` renders it and `resctl tune-interval --from-run` takes its
`calibration`. It is one pass over the events in time order (`Analyzer.feed`), keeping aggregates
per epoch and a bounded sample of each epoch's steps, so a run of any length is read in linear
time; the Prometheus metrics feed the same `Analyzer` as lines arrive. Definitions:

- **Epoch**: the events of one `(cycle, iteration)`: a launcher cycle (`cycle` = ft_launcher's
  restart count) or an in-process restart iteration within it. Every change of epoch is one
  recovery, of layer `launcher` (new cycle) or `inprocess` (new iteration).
- **Reference rank**: the lowest rank present. Step accounting uses its events only: in data
  parallel training every rank makes the same steps, and rank 0 is the one that writes plain
  checkpoints, so its step durations contain the real checkpoint stalls.
- **Step compute**: a step event's `duration` (time since the previous step) minus the
  `ckpt_stall` seconds recorded between the two; the first step of an epoch is not a sample
  (its duration contains start-up or recovery).
- **Durable checkpoint**: a `ckpt_persist` with a step, or a snapshot the script wrote itself
  with `torch.save` (`resctl.telemetry.snapshots`: at the step the shim counted when it was saved).
- **Calibration**: the save stall is the mean over each epoch's saves after its first (the first
  also allocates the staging arena); write time and size are means over all checkpoints. A
  script's own torch.save snapshot is a synchronous save: its time is both stall and write.
  Write interference: a reference-rank step's compute (its span since the previous step minus
  the save stalls in it) is split into time inside a write window (`ckpt_persist`: `[t - seconds,
  t]`, any rank) and time outside, by one sweep over both in time order. Steps with no overlap
  (under 1 % of their compute) give `c_0`, their mean compute; the others give `c_w` =
  overlapped time / the step work done in it, where a step's work outside the window is its
  outside time / `c_0`. `write_slowdown = c_w / c_0`. None when fewer than 3 steps of either kind.
- **Memory tier**: a reference-rank `ckpt_mem` blocked the loop for `[t - commit - seconds,
  t - commit]` (the event is written when its background commit ends); that time is a save stall
  and is taken out of step compute like a `ckpt_stall`, from the first step recorded after the
  event (a commit longer than a step moves it to a later step than the one it blocked: the mean
  step compute is the same). Calibration: the snapshot stall is
  the mean of `seconds - waited` over each epoch's snapshots after its first (the first also maps
  the slot), `commit` and `bytes` are means over all; the memory interval is plan.json's
  `checkpoint.memory_every`, else the most common gap between snapshot steps.
- **Kept step**: a step not rolled back, i.e. not above the step a later epoch resumed from.
- **Training goodput**: kept steps x their compute (the first step of an epoch counts the mean
  step compute), over the wall time from the first `start` to the last event.
- **Infrastructure goodput**: time the workers were up, over the same wall time. A launcher cycle
  is up from its last rank's `start` to its last event; in-process restarts keep the workers up.
  The series gives both goodputs so far at every reference-rank step (`goodput`, `infra`).
- **Cause of a recovery**: the fault that started it, in this order: a fault drill's (injected);
  a worker's own error; a rank that ended without any record before a launcher restart (`killed`:
  a signal, the OOM killer or a heartbeat timeout), timed at its last record; a collective error
  on a rank whose peer failed ("Connection closed by peer", DistBackendError, ...); SIGTERM.
- **Recovery of one fault** (fault -> first step), in four phases:
  detection: the fault to the moment the old epoch stopped (launcher: the first `sigterm` fault
  or `end` of a surviving rank, else the old epoch's last event; in-process: the first `restart`
  event, so NVRx's teardown and barrier count here); restart: to the last rank's `start`
  (launcher) or `restart` (in-process); checkpoint load: to the last rank's `resume`; first
  step: to the last rank's first step. A fault without a record is timed from the old epoch's
  last step.
- **Phases of the restart** (the same split bench/scale measures at N simulated nodes), launcher
  recoveries: stop, detection to the old epoch's last record (the survivors gone); rendezvous, to
  the first new worker process created (`start`'s `spawned`: the launchers' rendezvous and rank
  assignment are done); start workers, to the last rank's `start`. Without `spawned` (runs
  before it existed) the rendezvous runs to the last `start` and start workers is None.
  In-process: stop is None, rendezvous is the first to the last rank's `restart` (the wrapper's
  barrier). stop + rendezvous + start workers = restart.
- **Rollback**: the highest step the old epoch reached minus the step it resumed from.
- **Checkpoint freshness**: at every reference-rank step, how many steps and seconds ago the
  newest durable checkpoint was taken (from the run's start when none yet).
"""

from __future__ import annotations

import bisect
import math
import re
from array import array
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from resctl.telemetry.events import Event, as_events
from resctl.telemetry.snapshots import Durable, SnapshotLedger

EpochKey = tuple[int, int]

NO_FAULT_EVENT = "unrecorded"  # cause when no rank left any sign of what failed
KILLED = "killed"  # a rank ended without a record: a signal, the OOM killer, a heartbeat timeout
#: Errors a rank sees when a *peer* failed: secondary to that peer's fault.
PEER_ERROR = re.compile(r"closed by peer|connection reset|broken pipe|DistBackendError|DistNetworkError|"
                        r"DistStoreError|RankShouldRestart|ProcessGroup(Gloo|NCCL)|NCCL (error|communicator)|"
                        r"\[gloo|gloo/transport", re.IGNORECASE)
TRACK_CAP = 4096  # step samples kept per epoch (decimated beyond: exact for rollbacks to a sample)
METRICS_TRACK_CAP = 256  # the same for the metrics (no calibration): a few KB per epoch
SERIES_CAP = 2000  # points of the goodput / freshness series
TIMELINE_KINDS = ("start", "ckpt_persist", "snapshot", "fault", "restart", "ckpt_load", "resume", "end", "ckpt_skip")
MIN_INTERFERENCE_SAMPLES = 3


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


@dataclass(frozen=True)
class Calibration:
    """Measured inputs of the interval model (seconds)."""

    step_time: float  # mean step compute of the reference rank
    step_time_p50: float
    step_samples: int
    stall: float | None  # mean time a save blocked, minus its wait for the previous save
    waited: float | None  # mean wait for the previous save (back-pressure seen in the run)
    write: float | None  # mean stage-to-durable time of a checkpoint (max over ranks per step)
    write_bytes: float | None
    saves: int
    interval_steps: int | None  # from plan.json, else the most common gap between saves
    async_: bool | None
    restart: float | None  # mean fault-to-first-step of the recoveries
    unplanned_faults: int  # recoveries not caused by an injected fault (for an observed MTBF)
    wall_s: float
    step_time_idle: float | None = None  # c_0: mean compute of steps that overlap no write
    step_time_writing: float | None = None  # c_w: compute per step while a write runs
    write_slowdown: float | None = None  # c_w / c_0 (None: too few steps of either kind)
    idle_samples: int = 0
    writing_samples: int = 0
    mem_snapshots: int = 0  # ckpt_mem events of the reference rank (0: the memory tier was off)
    mem_stall: float | None = None  # mean time a memory snapshot blocked, minus its wait
    mem_waited: float | None = None  # mean wait for the previous commit or a disk write reading the slot
    mem_commit: float | None = None  # mean staged-to-committed time in the background
    mem_bytes: float | None = None
    memory_every: int | None = None  # from plan.json, else the most common gap between snapshots
    #: where async_ comes from: "plan.json" (checkpoint.async), "torch.save" (the script's own saves,
    #: which block whatever plan.json says), "" (unknown)
    async_source: str = ""


@dataclass(frozen=True)
class Sample:
    """One point of the goodput / freshness series (reference rank, at a step)."""

    t: float
    step: int
    goodput: float
    age_steps: int
    age_s: float
    kept: bool
    infra: float = 0.0  # infrastructure goodput so far: time the workers were up / time since the start


@dataclass
class RunAnalysis:
    wall_s: float
    training_goodput: float
    infrastructure_goodput: float
    productive_s: float
    up_s: float
    kept_steps: int
    steps_run: int
    final_step: int
    recoveries: list[Recovery]
    recovery_stats: dict[str, dict[str, float | None]]
    rollback_stats: dict[str, float | None]
    freshness: dict[str, float | None]
    causes: dict[str, int]
    checkpoints: int
    calibration: Calibration
    timeline: list[dict[str, Any]]
    series: list[Sample] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    t0: float = 0.0
    snapshots: int = 0  # of `checkpoints`: the script's own torch.save snapshots
    damaged_lines: int = 0  # lines of the events files that were skipped (see `events.ReadStats`)
    failed_saves: int = 0  # ckpt_fail events: checkpoint writes that failed (retried at the next interval)
    skipped_checkpoints: int = 0  # ckpt_skip events: checkpoints a load refused (damaged: quarantined)
    last_save_error: str | None = None

    def to_json(self, series: bool = True) -> dict[str, Any]:
        data = asdict(self)
        if not series:
            data.pop("series")
        return data


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    return {"count": float(len(values)), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values) if values else None, "mean": sum(values) / len(values) if values else None}


class StepTrack:
    """The reference rank's steps of one epoch: cumulative count and compute at sampled steps.

    Every step is sampled until `TRACK_CAP`; then every other sample is dropped and the stride
    doubles. `upto(s)` is exact at a sample and interpolated between two (exact for the count of
    consecutive steps), so memory is bounded whatever the run's length.
    """

    __slots__ = ("steps", "counts", "computes", "firsts", "stride", "n", "compute", "first_steps", "last_step", "cap")

    def __init__(self, cap: int = TRACK_CAP) -> None:
        self.cap = cap
        self.steps, self.counts, self.computes = array("q"), array("q"), array("d")
        self.firsts: list[int] = []  # steps with no compute sample (first of the epoch, after a resume)
        self.stride, self.n, self.compute = 1, 0, 0.0
        self.first_steps = 0
        self.last_step: int | None = None

    def add(self, step: int, compute: float | None) -> None:
        self.n += 1
        if compute is None:
            self.first_steps += 1
            if len(self.firsts) < 64:
                self.firsts.append(step)
        else:
            self.compute += compute
        self.last_step = step
        if (self.n - 1) % self.stride == 0:
            self.steps.append(step)
            self.counts.append(self.n)
            self.computes.append(self.compute)
            if len(self.steps) > self.cap:
                for arr in (self.steps, self.counts, self.computes):
                    del arr[1::2]
                self.stride *= 2

    def upto(self, cutoff: float, mean_step: float) -> tuple[int, float]:
        """(steps, compute) of the steps numbered <= cutoff (first steps count `mean_step`)."""
        if self.n == 0:
            return 0, 0.0
        firsts = sum(1 for s in self.firsts if s <= cutoff)
        if self.last_step is not None and cutoff >= self.last_step and cutoff >= self.steps[-1]:
            return self.n, self.compute + firsts * mean_step
        i = bisect.bisect_right(self.steps, cutoff) - 1
        if i < 0:
            return 0, 0.0
        count, compute = float(self.counts[i]), self.computes[i]
        nxt = (self.steps[i + 1], self.counts[i + 1], self.computes[i + 1]) if i + 1 < len(self.steps) else \
            (self.last_step or 0, self.n, self.compute)
        gap = nxt[0] - self.steps[i]
        if gap > 0 and cutoff > self.steps[i]:
            frac = (cutoff - self.steps[i]) / gap
            count += frac * (nxt[1] - count)
            compute += frac * (nxt[2] - compute)
        return int(round(count)), compute + firsts * mean_step


class _SaveStats:
    """Stalls and writes of one kind of save, for the calibration."""

    def __init__(self) -> None:
        self.count = [0.0, 0.0]  # blocked seconds (seconds - waited), saves
        self.steady = [0.0, 0.0]  # the same without each epoch's first save
        self.waited = [0.0, 0.0]
        self.first_seen: set[EpochKey] = set()
        self.steps: set[int] = set()  # steps saved by the reference rank
        self.writes: dict[tuple[EpochKey, int | None, int], list[float]] = {}  # -> [seconds, bytes, recycled]
        self.any_recycled = False

    def stall(self, epoch: EpochKey, blocked: float, waited: float) -> None:
        self.count[0] += blocked
        self.count[1] += 1
        self.waited[0] += waited
        self.waited[1] += 1
        if epoch in self.first_seen:
            self.steady[0] += blocked
            self.steady[1] += 1
        self.first_seen.add(epoch)

    def write(self, epoch: EpochKey, step: int | None, seconds: float, size: int, recycled: bool) -> None:
        # One write per (epoch, step) over all ranks: the slowest rank's time, the sum of the sizes.
        key = (epoch, step, -1 if step is not None else len(self.writes))
        slot = self.writes.setdefault(key, [0.0, 0.0, 0.0])
        slot[0] = max(slot[0], seconds)
        slot[1] += size
        slot[2] = max(slot[2], 1.0 if recycled else 0.0)
        self.any_recycled |= recycled

    def interval(self) -> int | None:
        """The most common gap between saved steps."""
        saved = sorted(self.steps)
        gaps = Counter(b - a for a, b in zip(saved, saved[1:]) if b > a)
        return gaps.most_common(1)[0][0] if gaps else None

    def means(self) -> tuple[float | None, float | None, float | None, float | None]:
        """(stall, waited, write, bytes): steady-state stall, write over recycled files when any."""
        steady = self.steady if self.steady[1] else self.count
        writes = [v for v in self.writes.values() if v[2]] if self.any_recycled else list(self.writes.values())
        return (steady[0] / steady[1] if steady[1] else None,
                self.waited[0] / self.waited[1] if self.waited[1] else None,
                sum(w[0] for w in writes) / len(writes) if writes else None,
                sum(w[1] for w in writes) / len(writes) if writes else None)


class _Epoch:
    """Aggregates of one (cycle, iteration): all a recovery, kept steps and up time need."""

    def __init__(self, key: EpochKey, t: float, cap: int) -> None:
        self.key = key
        self.first_t = self.last_t = t
        self.start_max: float | None = None
        self.spawned_min: float | None = None  # earliest `spawned` of a start in this epoch
        self.restart_min: float | None = None
        self.restart_max: float | None = None
        self.resume_max_t: float | None = None
        self.resume_min_step: int | None = None
        self.load_tiers: set[str] = set()
        self.max_step: int | None = None
        self.min_step: int | None = None
        self.last_step_t: float | None = None
        self.first_step_t: dict[int, float] = {}
        self.faults: list[Event] = []
        self.stops: list[tuple[float, int]] = []  # (t, rank) of sigterm faults and ends
        self.terminal: set[int] = set()  # ranks that recorded a fault or an end
        self.last_by_rank: dict[int, float] = {}
        self.track = StepTrack(cap)
        # reference-rank step accounting
        self.first = True
        self.prev_t: float | None = None
        self.stalls: list[tuple[float, float]] = []

    def resume_point(self) -> int | None:
        if self.resume_min_step is not None:
            return self.resume_min_step
        if self.track.n:
            return (self.track.steps[0] if self.track.steps else 0) - 1
        return None


class Analyzer:
    """Streaming analysis: `feed` every event in time order, then `result()` (any number of times).

    `calibrate=False, history=False` (the metrics) keeps no per-step data: memory is bounded by the
    number of epochs, ranks, checkpoint steps and paths in flight. `calibrate=True` also keeps one
    float per reference step for the step-time median and the write-interference sweep; `history`
    the timeline (no steps) and a series of at most `SERIES_CAP` points.
    """

    def __init__(self, ref: int | None = None, plan: Mapping[str, Any] | None = None, calibrate: bool = True,
                 history: bool = True) -> None:
        self.ref = ref
        self.plan = plan
        self.calibrate = calibrate
        self.history = history  # keep the timeline and the series (the report; not the metrics)
        self.epochs: dict[EpochKey, _Epoch] = {}
        self.cycle_shift: dict[int, int] = {}  # rank -> cycles added (a replaced node, see _epoch_key)
        self.last_key: dict[int, EpochKey] = {}
        self.t0: float | None = None
        self.t_first: float | None = None
        self.t_end: float | None = None
        self.ranks: set[int] = set()
        self.events = 0
        self.ledger = SnapshotLedger()
        # step compute samples
        self.samples_n, self.samples_sum = 0, 0.0
        self.samples = array("d")
        # calibration
        self.ckpt = _SaveStats()  # resctl.checkpoint saves and intercepted torch.save (ckpt_* events)
        self.plain = _SaveStats()  # the script's own plain torch.save (snapshot events)
        self.engine_saves = 0  # resctl.checkpoint saves (their interval is checkpoint.interval_steps)
        self.mem = _SaveStats()  # memory-tier snapshots (ckpt_mem) of the reference rank
        self.mem_commit = [0.0, 0.0, 0.0, 0.0]  # commit seconds, commits timed, bytes, snapshots sized
        self.windows: list[tuple[float, float]] = []
        self.pieces = array("d")  # start, end, step index (flat triples)
        self.piece_compute = array("d")
        # durable checkpoints and freshness
        self.durable_steps: set[int] = set()
        self.failed_saves, self.skipped_checkpoints = 0, 0
        self.last_save_error: str | None = None
        self.snapshot_steps: set[int] = set()
        self.latest: tuple[float, int] | None = None
        self.age_n, self.age_steps_sum, self.age_s_sum = 0, 0.0, 0.0
        self.age_steps_max: float | None = None
        self.age_s_max: float | None = None
        self.series: list[tuple[float, int, EpochKey, int, float]] = []  # t, step, epoch, age steps, age s
        self.series_stride, self.ref_steps = 1, 0
        self.timeline: list[Event] = []

    # -- feeding -----------------------------------------------------------------------------
    def feed(self, e: Event) -> None:
        t, kind, rank = e["t"], e["kind"], e["rank"]
        self.events += 1
        if rank not in self.ranks:
            self.ranks.add(rank)
            if self.ref is None or rank < self.ref:
                self.ref = rank  # streaming without a rank list: the lowest seen so far
        if self.t_first is None:
            self.t_first = t
        if self.t_end is None or t > self.t_end:
            self.t_end = t
        key = self._epoch_key(e, kind, rank)
        ep = self.epochs.get(key)
        if ep is None:
            ep = self.epochs[key] = _Epoch(key, t, TRACK_CAP if self.calibrate else METRICS_TRACK_CAP)
        if t > ep.last_t:
            ep.last_t = t
        elif t < ep.first_t:
            ep.first_t = t
        ep.last_by_rank[rank] = t
        if kind == "step":
            self._step(ep, e, t, rank)
        else:
            self._other(ep, e, t, kind, rank)

    def _epoch_key(self, e: Event, kind: str, rank: int) -> EpochKey:
        """The event's (cycle, iteration), with a replaced node's cycles moved on: a node lost and
        replaced (a new pod) starts a new launcher, which counts its restarts from 0 again, while the
        surviving nodes' launchers count the restart that took it in. So a `start` of a rank at or
        before a cycle it already had is taken as the next cycle, and its later events follow."""
        cycle = e["cycle"] + self.cycle_shift.get(rank, 0)
        key = (cycle, e["iteration"])
        prev = self.last_key.get(rank)
        if kind == "start" and prev is not None and key <= prev:
            self.cycle_shift[rank] = self.cycle_shift.get(rank, 0) + prev[0] + 1 - cycle
            key = (prev[0] + 1, e["iteration"])
        self.last_key[rank] = key
        return key

    def _other(self, ep: _Epoch, e: Event, t: float, kind: str, rank: int) -> None:
        if kind == "ckpt_stall":
            self._stall(ep, e, rank == self.ref)
        elif kind == "ckpt_mem":
            if rank == self.ref:
                self._mem(ep, e)
        elif kind == "start":
            if self.t0 is None or t < self.t0:
                self.t0 = t
            ep.start_max = t if ep.start_max is None else max(ep.start_max, t)
            spawned = e.get("spawned")
            if spawned is not None and (ep.spawned_min is None or spawned < ep.spawned_min):
                ep.spawned_min = spawned
        elif kind == "restart":
            ep.restart_min = t if ep.restart_min is None else min(ep.restart_min, t)
            ep.restart_max = t if ep.restart_max is None else max(ep.restart_max, t)
        elif kind == "ckpt_load":
            ep.load_tiers.add(e["tier"])
        elif kind == "resume":
            ep.resume_max_t = t if ep.resume_max_t is None else max(ep.resume_max_t, t)
            ep.resume_min_step = e["step"] if ep.resume_min_step is None else min(ep.resume_min_step, e["step"])
        elif kind == "fault":
            ep.terminal.add(rank)
            if e["cause"] == "sigterm":
                ep.stops.append((t, rank))
            if len(ep.faults) < 256:
                ep.faults.append(e)
        elif kind == "end":
            ep.terminal.add(rank)
            ep.stops.append((t, rank))
        elif kind == "ckpt_persist":
            self._persist(ep, e)
        elif kind == "ckpt_fail":
            self.failed_saves += 1
            self.last_save_error = e["error"]
        elif kind == "ckpt_skip":
            self.skipped_checkpoints += 1
        if kind in ("start", "resume", "restart") and rank == self.ref:
            ep.first, ep.prev_t, ep.stalls = True, None, []
        durable = self.ledger.feed(e)
        if durable is not None:
            self._durable_snapshot(ep, durable, e)
        if self.history and kind in TIMELINE_KINDS:
            self.timeline.append(e)

    def _step(self, ep: _Epoch, e: Event, t: float, rank: int) -> None:
        step = e["step"]
        if ep.max_step is None or step > ep.max_step:
            ep.max_step = step
        if ep.min_step is None or step < ep.min_step:
            ep.min_step = step
        ep.last_step_t = t
        if rank not in ep.first_step_t:
            ep.first_step_t[rank] = t
        if rank != self.ref:
            return
        compute = None
        if not ep.first:
            stalls = ep.stalls
            compute = e["duration"] - sum(b - a for a, b in stalls) if stalls else e["duration"]
            if compute < 0.0:
                compute = 0.0
            self.samples_n += 1
            self.samples_sum += compute
            if self.calibrate:
                self.samples.append(compute)
                prev = ep.prev_t
                if prev is not None and t > prev:
                    if stalls:
                        self._pieces(prev, t, stalls)
                    else:
                        self.pieces.extend((prev, t, float(len(self.piece_compute))))
                        self.piece_compute.append(t - prev)
        ep.track.add(step, compute)
        ep.first, ep.prev_t = False, t
        if ep.stalls:
            ep.stalls = []
        self._freshness(ep, t, step)

    def _pieces(self, a: float, t: float, stalls: list[tuple[float, float]]) -> None:
        """The compute pieces of one step (its span minus the save stalls in it)."""
        idx = float(len(self.piece_compute))
        total = 0.0
        for x, y in _merge(stalls):
            if x > a:
                self.pieces.extend((a, min(x, t), idx))
                total += min(x, t) - a
            a = max(a, y)
        if a < t:
            self.pieces.extend((a, t, idx))
            total += t - a
        self.piece_compute.append(total)

    def _freshness(self, ep: _Epoch, t: float, step: int) -> None:
        t0 = self.t0 if self.t0 is not None else (self.t_first or t)
        latest = self.latest
        age_steps = step - (latest[1] if latest else 0)
        age_s = t - (latest[0] if latest else t0)
        self.age_n += 1
        self.age_steps_sum += age_steps
        self.age_s_sum += age_s
        self.age_steps_max = age_steps if self.age_steps_max is None else max(self.age_steps_max, age_steps)
        self.age_s_max = age_s if self.age_s_max is None else max(self.age_s_max, age_s)
        if self.history and self.ref_steps % self.series_stride == 0:
            self.series.append((t, step, ep.key, age_steps, age_s))
            if len(self.series) > SERIES_CAP:
                del self.series[1::2]
                self.series_stride *= 2
        self.ref_steps += 1

    def _stall(self, ep: _Epoch, e: Event, is_ref: bool) -> None:
        if not is_ref:
            return
        seconds, waited = e["seconds"], e["waited"] or 0.0
        ep.stalls.append((e["t"] - seconds, e["t"]))
        self.ckpt.stall(ep.key, max(0.0, seconds - waited), waited)
        if e["path"] is None:  # resctl.checkpoint.save; an intercepted torch.save's step is its snapshot's
            self.engine_saves += 1
            if e["step"] is not None:
                self.ckpt.steps.add(e["step"])

    def _mem(self, ep: _Epoch, e: Event) -> None:
        seconds, waited, commit = e["seconds"], e["waited"] or 0.0, e["commit"] or 0.0
        end = e["t"] - commit
        ep.stalls.append((end - seconds, end))
        self.mem.stall(ep.key, max(0.0, seconds - waited), waited)
        self.mem.steps.add(e["step"])
        if e["commit"] is not None:
            self.mem_commit[0] += commit
            self.mem_commit[1] += 1
        if e["bytes"] is not None:
            self.mem_commit[2] += e["bytes"]
            self.mem_commit[3] += 1

    def _persist(self, ep: _Epoch, e: Event) -> None:
        t, seconds = e["t"], e["seconds"]
        if e["path"] is None and e["step"] is not None:
            self._mark_durable(t, e["step"])
        if not self.calibrate:
            return
        if seconds > 0:
            self.windows.append((t - seconds, t))
        self.ckpt.write(ep.key, e["step"] if e["path"] is None else None, seconds, e["bytes"] or 0,
                        bool(e["recycled"]))

    def _durable_snapshot(self, ep: _Epoch, d: Durable, e: Event) -> None:
        self._mark_durable(d.t, d.step)
        self.snapshot_steps.add(d.step)
        stats = self.ckpt if d.intercepted else self.plain
        if d.rank == self.ref:
            stats.steps.add(d.step)
        if d.intercepted:
            return  # its ckpt_stall and ckpt_persist were counted as they came
        if d.seconds > 0 and self.calibrate:
            self.windows.append((d.t - d.seconds, d.t))
        if d.rank == self.ref:
            # A plain torch.save blocks the script for the whole write.
            ep.stalls.append((d.t - d.seconds, d.t))
            self.plain.stall(ep.key, d.seconds, 0.0)
        if self.calibrate:
            self.plain.write(ep.key, None, d.seconds, d.bytes or 0, False)

    def _mark_durable(self, t: float, step: int) -> None:
        self.durable_steps.add(step)
        if self.latest is None or t >= self.latest[0]:
            self.latest = (t, step)  # the newest by time: after a rollback that is the one a restart loads

    # -- results -----------------------------------------------------------------------------
    def result(self, damaged_lines: int = 0, series: bool = True) -> RunAnalysis:
        if not self.events or self.t_end is None:
            raise ValueError("the run has no events")
        t0 = self.t0 if self.t0 is not None else (self.t_first or 0.0)
        wall = max(self.t_end - t0, 1e-9)
        order = sorted(self.epochs)
        eps = [self.epochs[k] for k in order]
        mean_step = self.samples_sum / self.samples_n if self.samples_n else 0.0

        # Kept steps: not above any later epoch's resume point (suffix minimum).
        cutoffs: list[float] = [math.inf] * len(eps)
        running = math.inf
        for i in range(len(eps) - 1, -1, -1):
            cutoffs[i] = running
            r = eps[i].resume_point()
            if r is not None:
                running = min(running, r)
        kept_before: list[float] = []
        kept_n, productive, steps_run = 0, 0.0, 0
        for ep, cut in zip(eps, cutoffs):
            kept_before.append(productive)
            n, c = ep.track.upto(cut, mean_step)
            kept_n += n
            productive += c
            steps_run += ep.track.n

        spans: list[tuple[float, float]] = []  # (begin, end) the workers of each launcher cycle were up
        for cycle in sorted({k[0] for k in order}):
            ces = [ep for ep in eps if ep.key[0] == cycle]
            starts = [ep.start_max for ep in ces if ep.start_max is not None]
            begin = max(starts) if starts else min(ep.first_t for ep in ces)
            spans.append((begin, max(begin, max(ep.last_t for ep in ces))))
        up = sum(end - begin for begin, end in spans)

        def up_until(t: float) -> float:
            return sum(max(0.0, min(t, end) - begin) for begin, end in spans)

        recoveries = [_recovery(a, b, t0) for a, b in zip(eps, eps[1:])]
        index = {ep.key: i for i, ep in enumerate(eps)}
        points = []
        for t, step, key, age_steps, age_s in self.series if series else ():
            i = index[key]
            kept = step <= cutoffs[i]
            _, c = eps[i].track.upto(min(step, cutoffs[i]), mean_step)
            since = max(t - t0, 1e-9)
            points.append(Sample(t - t0, step, (kept_before[i] + c) / since, age_steps, age_s, kept,
                                 up_until(t) / since))
        n = self.age_n
        freshness = {
            "mean_age_steps": self.age_steps_sum / n if n else None, "max_age_steps": self.age_steps_max,
            "mean_age_s": self.age_s_sum / n if n else None, "max_age_s": self.age_s_max,
        }
        done = [r for r in recoveries if r.total is not None]  # the new epoch made a step
        return RunAnalysis(
            wall_s=wall, training_goodput=productive / wall, infrastructure_goodput=up / wall,
            productive_s=productive, up_s=up, kept_steps=kept_n, steps_run=steps_run,
            final_step=max((ep.track.last_step for ep in eps if ep.track.last_step is not None), default=0),
            recoveries=recoveries,
            recovery_stats={key: _stats([v for r in done if (v := getattr(r, key)) is not None])
                            for key, _ in RECOVERY_STATS},
            rollback_stats=_stats([float(r.rollback_steps) for r in recoveries]),
            freshness=freshness,
            causes=dict(Counter(f"{r.layer}: {r.cause}" for r in recoveries)),
            checkpoints=len(self.durable_steps),
            calibration=self._calibration(recoveries, wall, mean_step),
            timeline=[_timeline_row(e, t0) for e in self.timeline],
            series=points, ranks=sorted(self.ranks), t0=t0,
            snapshots=len(self.snapshot_steps), damaged_lines=damaged_lines,
            failed_saves=self.failed_saves, skipped_checkpoints=self.skipped_checkpoints,
            last_save_error=self.last_save_error,
        )

    def _calibration(self, recoveries: list[Recovery], wall: float, mean_step: float) -> Calibration:
        # The job's checkpoints: resctl.checkpoint's or the intercepted torch.save's when there are
        # any (a plain torch.save of the final weights is not one of them), else the script's own.
        saves = self.ckpt if self.ckpt.count[1] else self.plain
        interval, async_, memory_every = _plan_checkpoint(self.plan)
        if self.snapshot_steps and not self.engine_saves:
            interval = None  # the script saves when it wants: checkpoint.interval_steps does not apply
        if interval is None:
            interval = saves.interval()
        async_source = "plan.json" if async_ is not None else ""
        if saves is self.plain and saves.count[1]:
            async_, async_source = False, "torch.save"  # the script's own torch.save: every save blocks for its write
        totals = [r.total for r in recoveries if r.total is not None]
        c0, cw, n_idle, n_busy = self._interference() if self.calibrate else (None, None, 0, 0)
        stall, waited, write, size = saves.means()
        mem_stall, mem_waited, _, _ = self.mem.means()
        commits, commit_n, mem_bytes, bytes_n = self.mem_commit
        return Calibration(
            step_time=mean_step,
            step_time_p50=(percentile(self.samples, 50) or 0.0) if self.calibrate else mean_step,
            step_samples=self.samples_n,
            stall=stall, waited=waited, write=write, write_bytes=size,
            saves=int(saves.count[1]), interval_steps=interval, async_=async_, async_source=async_source,
            restart=sum(totals) / len(totals) if totals else None,
            unplanned_faults=sum(1 for r in recoveries if not r.injected),
            wall_s=wall, step_time_idle=c0, step_time_writing=cw,
            write_slowdown=cw / c0 if cw is not None and c0 else None,
            idle_samples=n_idle, writing_samples=n_busy,
            mem_snapshots=int(self.mem.count[1]), mem_stall=mem_stall, mem_waited=mem_waited,
            mem_commit=commits / commit_n if commit_n else None, mem_bytes=mem_bytes / bytes_n if bytes_n else None,
            memory_every=memory_every if memory_every else self.mem.interval(),
        )

    def _interference(self) -> tuple[float | None, float | None, int, int]:
        """(c_0, c_w, idle steps, writing steps): one sweep of the step pieces over the merged
        write windows, both in time order."""
        windows = _merge(self.windows)
        overlap = [0.0] * len(self.piece_compute)
        p = self.pieces
        order = range(0, len(p), 3)
        if any(p[i] < p[i - 3] for i in range(3, len(p), 3)):
            order = sorted(order, key=lambda i: p[i])  # type: ignore[assignment]
        j = 0
        for i in order:
            a, b = p[i], p[i + 1]
            while j < len(windows) and windows[j][1] <= a:
                j += 1
            k = j
            while k < len(windows) and windows[k][0] < b:
                overlap[int(p[i + 2])] += max(0.0, min(b, windows[k][1]) - max(a, windows[k][0]))
                k += 1
        steps = [(c, o) for c, o in zip(self.piece_compute, overlap) if c > 0]
        idle = [c for c, o in steps if o <= 0.01 * c]
        busy = [(c, o) for c, o in steps if o > 0.01 * c]
        if len(idle) < MIN_INTERFERENCE_SAMPLES:
            return None, None, len(idle), len(busy)
        c0 = sum(idle) / len(idle)
        work = sum(1.0 - (c - o) / c0 for c, o in busy)
        if len(busy) < MIN_INTERFERENCE_SAMPLES or work <= 0:
            return c0, None, len(idle), len(busy)
        return c0, sum(o for _, o in busy) / work, len(idle), len(busy)


def analyze(records: Iterable[Mapping[str, Any]], plan: Mapping[str, Any] | None = None) -> RunAnalysis:
    """Everything `resctl report` shows, from a run's records (any order; each is validated
    against `events.KINDS`, invalid ones are skipped) and its plan.json."""
    events = sorted(as_events(records), key=lambda e: (e["t"], e["rank"]))
    return analyze_stream(events, plan, ref=min((e["rank"] for e in events), default=None))


def analyze_stream(events: Iterable[Event], plan: Mapping[str, Any] | None = None, *, ref: int | None,
                   damaged_lines: int = 0) -> RunAnalysis:
    """`analyze` over validated events in time order (`events.read_run`), in one pass."""
    analyzer = Analyzer(ref, plan if isinstance(plan, Mapping) else None)
    for e in events:
        analyzer.feed(e)
    return analyzer.result(damaged_lines)


def _plan_checkpoint(plan: Mapping[str, Any] | None) -> tuple[int | None, bool | None, int | None]:
    """(interval_steps, async, memory_every) of plan.json's profile; None where absent or not valid."""
    profile = plan.get("profile") if isinstance(plan, Mapping) else None
    section = profile.get("checkpoint") if isinstance(profile, Mapping) else None
    if not isinstance(section, Mapping):
        return None, None, None
    interval = section.get("interval_steps")
    mode = section.get("async")
    memory = section.get("memory_every")
    return ((interval if type(interval) is int and interval > 0 else None), (mode if isinstance(mode, bool) else None),
            (memory if type(memory) is int and memory > 0 else None))


def _timeline_row(e: Event, t0: float) -> dict[str, Any]:
    row = {"t": round(e["t"] - t0, 6), "rank": e["rank"], "cycle": e["cycle"], "iteration": e["iteration"],
           "kind": e["kind"]}
    for k in ("step", "cause", "layer", "status", "seconds", "reason", "injected", "path", "source", "tier"):
        if e.get(k) is not None:
            row[k] = e[k]
    return row


def _primary(old: _Epoch, launcher: bool) -> tuple[str, int | None, bool, float | None]:
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


def _recovery(old: _Epoch, new: _Epoch, t0: float) -> Recovery:
    launcher = new.key[0] != old.key[0]
    cause, rank, injected, t_fault = _primary(old, launcher)
    last_step = old.max_step or 0
    if t_fault is None:
        t_fault = old.last_step_t if old.last_step_t is not None else old.last_t
    if launcher:
        stops = [t for t, r in old.stops if t >= t_fault and r != rank]
        t_detect = min(stops) if stops else max(t_fault, old.last_t)
        t_restarted = new.start_max if new.start_max is not None else t_detect
        t_stopped = min(max(old.last_t, t_detect), t_restarted)
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


def _merge(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
