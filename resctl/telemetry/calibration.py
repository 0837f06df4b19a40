"""The interval model's measured inputs, three accumulators of `goodput.Analyzer`: the reference
rank's step compute (`StepSamples`), the saves of each kind (`Saves`: stalls, writes, memory-tier
commits) and the write interference (`Interference`: step pieces swept over the write windows).
Definitions: `resctl.telemetry.goodput`'s docstring.
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from resctl.profile.contract import CheckpointPlan
from resctl.telemetry.epochs import EpochKey

MIN_INTERFERENCE_SAMPLES = 3

Span = tuple[float, float]


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


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def merge(spans: Iterable[Span]) -> list[Span]:
    """Overlapping spans joined, in order."""
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


@dataclass
class Mean:
    """A running sum and count."""

    total: float = 0.0
    n: int = 0

    def add(self, value: float) -> None:
        self.total += value
        self.n += 1

    def mean(self) -> float | None:
        return self.total / self.n if self.n else None


@dataclass
class Write:
    """One checkpoint's write over all ranks: the slowest rank's time, the sum of the sizes."""

    seconds: float = 0.0
    size: float = 0.0
    recycled: bool = False


@dataclass(frozen=True)
class SaveMeans:
    stall: float | None  # steady state: without each epoch's first save
    waited: float | None
    write: float | None  # over writes into recycled files when any
    size: float | None


@dataclass
class SaveStats:
    """Stalls and writes of one kind of save, for the calibration."""

    blocked: Mean = field(default_factory=Mean)  # seconds - waited, per save
    steady: Mean = field(default_factory=Mean)  # the same without each epoch's first save
    waited: Mean = field(default_factory=Mean)
    first_seen: set[EpochKey] = field(default_factory=set)
    steps: set[int] = field(default_factory=set)  # steps saved by the reference rank
    writes: dict[tuple[EpochKey, int | None, int], Write] = field(default_factory=dict)
    any_recycled: bool = False

    @property
    def saves(self) -> int:
        return self.blocked.n

    def stall(self, epoch: EpochKey, blocked: float, waited: float) -> None:
        self.blocked.add(blocked)
        self.waited.add(waited)
        if epoch in self.first_seen:
            self.steady.add(blocked)
        self.first_seen.add(epoch)

    def write(self, epoch: EpochKey, step: int | None, seconds: float, size: int, recycled: bool) -> None:
        key = (epoch, step, -1 if step is not None else len(self.writes))
        slot = self.writes.setdefault(key, Write())
        slot.seconds = max(slot.seconds, seconds)
        slot.size += size
        slot.recycled = slot.recycled or recycled
        self.any_recycled |= recycled

    def interval(self) -> int | None:
        """The most common gap between saved steps."""
        saved = sorted(self.steps)
        gaps = Counter(b - a for a, b in zip(saved, saved[1:]) if b > a)
        return gaps.most_common(1)[0][0] if gaps else None

    def means(self) -> SaveMeans:
        steady = self.steady if self.steady.n else self.blocked
        writes = [w for w in self.writes.values() if w.recycled] if self.any_recycled else list(self.writes.values())
        return SaveMeans(steady.mean(), self.waited.mean(),
                         sum(w.seconds for w in writes) / len(writes) if writes else None,
                         sum(w.size for w in writes) / len(writes) if writes else None)


class StepSamples:
    """The reference rank's step compute: mean over all, and every value when calibrating (median)."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.n, self.total = 0, 0.0
        self.values = array("d")

    def add(self, compute: float) -> None:
        self.n += 1
        self.total += compute
        if self.keep:
            self.values.append(compute)

    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    def p50(self) -> float:
        return (percentile(self.values, 50) or 0.0) if self.keep else self.mean()


class Interference:
    """Step compute inside and outside write windows: pieces of steps, swept over merged windows."""

    def __init__(self) -> None:
        self.windows: list[Span] = []
        self.pieces = array("d")  # start, end, step index (flat triples)
        self.piece_compute = array("d")

    def window(self, start: float, end: float) -> None:
        self.windows.append((start, end))

    def step(self, a: float, t: float, stalls: list[Span]) -> None:
        """The compute pieces of one step from `a` to `t` (its span minus the save stalls in it)."""
        idx = float(len(self.piece_compute))
        if not stalls:
            self.pieces.extend((a, t, idx))
            self.piece_compute.append(t - a)
            return
        total = 0.0
        for x, y in merge(stalls):
            if x > a:
                self.pieces.extend((a, min(x, t), idx))
                total += min(x, t) - a
            a = max(a, y)
        if a < t:
            self.pieces.extend((a, t, idx))
            total += t - a
        self.piece_compute.append(total)

    def sweep(self) -> tuple[float | None, float | None, int, int]:
        """(c_0, c_w, idle steps, writing steps): one sweep of the step pieces over the merged
        write windows, both in time order."""
        windows = merge(self.windows)
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


class Saves:
    """The saves of every kind: resctl.checkpoint's and the intercepted torch.save's (`ckpt`), the
    script's own torch.save (`plain`), the memory tier's snapshots (`mem`) and their commits."""

    def __init__(self) -> None:
        self.ckpt = SaveStats()  # resctl.checkpoint saves and intercepted torch.save (ckpt_* events)
        self.plain = SaveStats()  # the script's own plain torch.save (snapshot events)
        self.engine_saves = 0  # resctl.checkpoint saves (their interval is checkpoint.interval_steps)
        self.mem = SaveStats()  # memory-tier snapshots (ckpt_mem) of the reference rank
        self.commit = Mean()  # background commit seconds of the snapshots timed
        self.size = Mean()  # bytes of the snapshots sized
        self.failed, self.skipped = 0, 0  # ckpt_fail (writes that failed), ckpt_skip (checkpoints a load refused)
        self.last_error: str | None = None

    def chosen(self) -> SaveStats:
        """The job's checkpoints: resctl.checkpoint's or the intercepted torch.save's when there are
        any (a plain torch.save of the final weights is not one of them), else the script's own."""
        return self.ckpt if self.ckpt.saves else self.plain

    def calibration(self, planned: CheckpointPlan, own_snapshots: bool, samples: StepSamples,
                    interference: tuple[float | None, float | None, int, int], restarts: list[float],
                    unplanned: int, wall: float) -> Calibration:
        saves = self.chosen()
        interval = planned.interval_steps
        if own_snapshots and not self.engine_saves:
            interval = None  # the script saves when it wants: checkpoint.interval_steps does not apply
        if interval is None:
            interval = saves.interval()
        async_, async_source = planned.async_, "plan.json" if planned.async_ is not None else ""
        if saves is self.plain and saves.saves:
            async_, async_source = False, "torch.save"  # the script's own torch.save: every save blocks for its write
        c0, cw, n_idle, n_busy = interference
        disk, mem = saves.means(), self.mem.means()
        return Calibration(
            step_time=samples.mean(), step_time_p50=samples.p50(), step_samples=samples.n,
            stall=disk.stall, waited=disk.waited, write=disk.write, write_bytes=disk.size,
            saves=saves.saves, interval_steps=interval, async_=async_, async_source=async_source,
            restart=sum(restarts) / len(restarts) if restarts else None,
            unplanned_faults=unplanned,
            wall_s=wall, step_time_idle=c0, step_time_writing=cw,
            write_slowdown=cw / c0 if cw is not None and c0 else None,
            idle_samples=n_idle, writing_samples=n_busy,
            mem_snapshots=self.mem.saves, mem_stall=mem.stall, mem_waited=mem.waited,
            mem_commit=self.commit.mean(), mem_bytes=self.size.mean(),
            memory_every=planned.memory_every if planned.memory_every else self.mem.interval(),
        )
