"""Stragglers: a rank whose steps stay slower than the other ranks' by a margin (pure; fed step events).

What is compared: in a synchronous job (DDP, FSDP: the step events carry `busy`, resctl/shim/busy.py)
each rank's own work in a step, its step time less the time it was blocked in collectives; otherwise the
time between a rank's optimizer steps. Step times alone cannot name a slow rank of a synchronous job:
every rank waits for the slowest in its collectives, so all take its step time. The work outside the
waits differs, and the rank the others wait for stands out by it.

Each rank's recent time is the median of its last `RECENT` values (the first step of a cycle or
in-process iteration is left out: it holds the start and the load); ranks are compared with the ranks
judged by the same measure. A step of rank R is slow when R's recent time exceeds (1 + margin) x the
median of the other ranks' recent times and exceeds it by at least `FLOOR` (a few milliseconds of timer
and scheduler noise are no slow node, however large a ratio they make of tiny steps); after `steps`
slow steps in a row R is named, once, until it has run as many steps within the margin again.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Any

from resctl.telemetry.ranks import RecentSteps

RECENT = RecentSteps.RECENT  # step durations a rank's recent time is the median of
FLOOR = 0.005  # seconds: a rank this little slower than the others is not slow, whatever the ratio


@dataclass(frozen=True)
class Straggler:
    rank: int
    step: int
    seconds: float  # the rank's recent step time
    median: float  # the other ranks' median recent step time
    steps: int  # slow steps in a row
    cycle: int
    iteration: int
    t: float  # time of the step that named it
    measure: str = "step"  # "busy": own work outside the collectives' waits; "step": step durations

    @property
    def ratio(self) -> float:
        return self.seconds / self.median if self.median > 0 else float("inf")

    def message(self) -> str:
        what = ("its own work outside the collectives it waits in takes" if self.measure == "busy"
                else "its steps take")
        waits = f"; the others wait {self.seconds - self.median:.3g} s a step for it" if self.measure == "busy" else ""
        return (f"rank {self.rank} is a straggler: {what} {self.seconds:.3g} s, the other ranks' "
                f"{self.median:.3g} s (+{(self.ratio - 1) * 100:.0f} %), for {self.steps} steps in a row "
                f"(at step {self.step}{waits}; health.straggler_margin)")


class _Rank:
    __slots__ = ("fast", "measure", "named", "slow", "value")

    def __init__(self) -> None:
        self.slow = 0  # slow steps in a row
        self.fast = 0  # steps within the margin in a row since it was named
        self.named = False
        self.value: float | None = None  # recent time, once RECENT steps of the epoch are in
        self.measure = "step"  # what `value` is: "busy" (synchronous) or "step"


class StragglerDetector:
    """`feed(step_event)` returns a `Straggler` when a rank is named; `recent()` gives every rank's time."""

    def __init__(self, margin: float, steps: int) -> None:
        self.factor = 1.0 + margin
        self.steps = steps
        self.ranks: dict[int, _Rank] = {}
        self.times = RecentSteps()
        self.named_total = 0
        self._sorted: dict[str, list[float]] = {}  # measure -> every rank's recent time, refreshed about once a job step
        self._fed = 0

    def feed(self, e: dict[str, Any]) -> Straggler | None:
        r = self.ranks.get(e["rank"])
        if r is None:
            r = self.ranks[e["rank"]] = _Rank()
        value = self.times.feed(e)
        if value is None or not self.times.full(e["rank"]):  # a new epoch: its first steps held the start
            if value is None:
                r.slow, r.fast, r.value = 0, 0, None
            return None
        busy = self.times.busy(e["rank"])
        value, r.measure = (busy, "busy") if busy is not None else (value, "step")
        r.value = value
        self._fed += 1
        if self._fed >= len(self.ranks):  # O(ranks log ranks) per job step, not per rank step
            self._fed = 0
            self._sorted = {m: sorted(o.value for o in self.ranks.values() if o.value is not None and o.measure == m)
                            for m in ("busy", "step")}
        median = _median_without(self._sorted.get(r.measure, []), value)
        if median is None:
            return None
        if value - median < FLOOR or value <= self.factor * median:
            r.slow = 0
            if r.named:
                r.fast += 1
                if r.fast >= self.steps:
                    r.named, r.fast = False, 0  # recovered: a later episode is named again
            return None
        r.slow += 1
        r.fast = 0
        if r.named or r.slow < self.steps:
            return None
        r.named = True
        self.named_total += 1
        return Straggler(e["rank"], e["step"], value, median, r.slow, e["cycle"], e["iteration"], e["t"], r.measure)

    def recent(self) -> dict[int, float]:
        """rank -> its recent step time."""
        return self.times.recent()

    def named(self) -> list[int]:
        """Ranks named now (not yet recovered)."""
        return [rank for rank, r in sorted(self.ranks.items()) if r.named]


def _median_without(values: list[float], own: float) -> float | None:
    """Median of sorted `values` with one value nearest `own` left out (the rank's own, possibly stale)."""
    if len(values) < 2:
        return None
    i = min(bisect.bisect_left(values, own), len(values) - 1)
    if i > 0 and abs(values[i - 1] - own) < abs(values[i] - own):
        i -= 1
    others = values[:i] + values[i + 1:] if len(values) < 64 else None
    if others is not None:
        return statistics.median(others)
    n = len(values) - 1  # the median of the n others, by index into `values` skipping position i
    def at(k: int) -> float:
        return values[k if k < i else k + 1]
    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
