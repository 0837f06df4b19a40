"""The epochs of a run, one accumulator of `goodput.Analyzer`: which `(cycle, iteration)` each event
belongs to, the aggregates of each epoch a recovery needs, and from them the kept steps and the time
the workers were up (definitions: `resctl.telemetry.goodput`'s docstring).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from resctl.telemetry.events import Event

EpochKey = tuple[int, int]

TRACK_CAP = 4096  # step samples kept per epoch (decimated beyond: exact for rollbacks to a sample)
METRICS_TRACK_CAP = 256  # the same for the metrics (no calibration): a few KB per epoch
MAX_FAULTS = 256  # fault events kept per epoch (the cause of a recovery reads them)


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


class Epoch:
    """Aggregates of one (cycle, iteration): all a recovery, kept steps and up time need."""

    def __init__(self, key: EpochKey, t: float, cap: int) -> None:
        self.key = key
        self.first_t = self.last_t = t
        self.start_max: float | None = None
        self.spawned_min: float | None = None  # earliest `spawned` of a start in this epoch
        self.detected_min: float | None = None  # earliest launcher's `detected` of a start (the restart's clock)
        self.stopped_max: float | None = None  # latest launcher's `stopped` of a start
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
        # reference-rank step accounting: the next step is the epoch's first; its previous step's
        # time; the save stalls since then (taken out of its compute)
        self.first = True
        self.prev_t: float | None = None
        self.stalls: list[tuple[float, float]] = []

    def resume_point(self) -> int | None:
        if self.resume_min_step is not None:
            return self.resume_min_step
        if self.track.n:
            return (self.track.steps[0] if self.track.steps else 0) - 1
        return None

    def restart_accounting(self) -> None:
        """The reference rank started, restarted or resumed: its next step is a first step."""
        self.first, self.prev_t, self.stalls = True, None, []


@dataclass(frozen=True)
class Kept:
    """The steps not rolled back, over the epochs in order."""

    cutoffs: list[float]  # per epoch: the highest kept step number (a later epoch's resume point)
    before: list[float]  # per epoch: the kept compute of the epochs before it
    steps: int
    compute: float
    steps_run: int


class Epochs:
    """Every epoch of the run and the run's time span; `enter` files an event under its epoch."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.by_key: dict[EpochKey, Epoch] = {}
        self.cycle_shift: dict[int, int] = {}  # rank -> cycles added (a replaced node, see _key)
        self.last_key: dict[int, EpochKey] = {}
        self.t0: float | None = None  # the first `start`
        self.t_first: float | None = None
        self.t_end: float | None = None

    def enter(self, e: Event) -> Epoch:
        t, rank = e["t"], e["rank"]
        if self.t_first is None:
            self.t_first = t
        if self.t_end is None or t > self.t_end:
            self.t_end = t
        key = self._key(e, e["kind"], rank)
        ep = self.by_key.get(key)
        if ep is None:
            ep = self.by_key[key] = Epoch(key, t, self.cap)
        if t > ep.last_t:
            ep.last_t = t
        elif t < ep.first_t:
            ep.first_t = t
        ep.last_by_rank[rank] = t
        return ep

    def _key(self, e: Event, kind: str, rank: int) -> EpochKey:
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

    def lifecycle(self, ep: Epoch, e: Event, kind: str, rank: int) -> None:
        """A start, restart, ckpt_load, resume, fault or end: what the recoveries are timed from."""
        t = e["t"]
        if kind == "start":
            if self.t0 is None or t < self.t0:
                self.t0 = t
            ep.start_max = t if ep.start_max is None else max(ep.start_max, t)
            spawned, detected, stopped = e.get("spawned"), e.get("detected"), e.get("stopped")
            if spawned is not None and (ep.spawned_min is None or spawned < ep.spawned_min):
                ep.spawned_min = spawned
            if detected is not None and (ep.detected_min is None or detected < ep.detected_min):
                ep.detected_min = detected
            if stopped is not None and (ep.stopped_max is None or stopped > ep.stopped_max):
                ep.stopped_max = stopped
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
            if len(ep.faults) < MAX_FAULTS:
                ep.faults.append(e)
        elif kind == "end":
            ep.terminal.add(rank)
            ep.stops.append((t, rank))

    @staticmethod
    def step(ep: Epoch, e: Event, rank: int) -> None:
        """A step of any rank: the epoch's step range and when its ranks stepped."""
        step, t = e["step"], e["t"]
        if ep.max_step is None or step > ep.max_step:
            ep.max_step = step
        if ep.min_step is None or step < ep.min_step:
            ep.min_step = step
        ep.last_step_t = t
        if rank not in ep.first_step_t:
            ep.first_step_t[rank] = t

    def start(self) -> float:
        """The run's start: the first `start`, else the first event."""
        return self.t0 if self.t0 is not None else (self.t_first or 0.0)

    def ordered(self) -> list[Epoch]:
        return [self.by_key[k] for k in sorted(self.by_key)]

    @staticmethod
    def kept(eps: list[Epoch], mean_step: float) -> Kept:
        """Kept steps: not above any later epoch's resume point (suffix minimum)."""
        cutoffs: list[float] = [math.inf] * len(eps)
        running = math.inf
        for i in range(len(eps) - 1, -1, -1):
            cutoffs[i] = running
            r = eps[i].resume_point()
            if r is not None:
                running = min(running, r)
        before: list[float] = []
        kept_n, productive, steps_run = 0, 0.0, 0
        for ep, cut in zip(eps, cutoffs):
            before.append(productive)
            n, c = ep.track.upto(cut, mean_step)
            kept_n += n
            productive += c
            steps_run += ep.track.n
        return Kept(cutoffs, before, kept_n, productive, steps_run)

    @staticmethod
    def up_spans(eps: list[Epoch]) -> list[tuple[float, float]]:
        """(begin, end) the workers of each launcher cycle were up."""
        spans = []
        for cycle in sorted({ep.key[0] for ep in eps}):
            ces = [ep for ep in eps if ep.key[0] == cycle]
            starts = [ep.start_max for ep in ces if ep.start_max is not None]
            begin = max(starts) if starts else min(ep.first_t for ep in ces)
            spans.append((begin, max(begin, max(ep.last_t for ep in ces))))
        return spans

    def __iter__(self) -> Iterator[Epoch]:
        return iter(self.by_key.values())
