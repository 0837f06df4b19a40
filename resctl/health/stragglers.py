"""Stragglers: a rank whose steps stay slower than the other ranks' by a margin (pure; fed step events).

Each rank's recent step time is the median of its last `RECENT` step durations (the first step of a
cycle or in-process iteration is left out: it holds the start and the load). A step of rank R is
slow when R's recent time exceeds (1 + margin) x the median of the other ranks' recent times; after
`steps` slow steps in a row R is named, once, until it has run as many steps within the margin again.
Ranks whose steps are shorter than `FLOOR` are not judged: timer noise, not a slow node.

What it can and cannot see: it compares the time between a rank's optimizer steps. A job whose ranks
wait for each other in every step (DDP's gradient all-reduce) gives every rank the slowest rank's step
time, so a slow node there slows the whole job evenly and is not named here; the cluster preflight's
per-node matmul and link tests (`resctl doctor --cluster`, `launch.preflight = "cluster"`) name it.
It names ranks that do not wait for the others each step: data-loading or pipeline stalls,
asynchronous or independent workers, ranks between synchronisation points.
"""

from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Any

from resctl.telemetry.ranks import RecentSteps

RECENT = RecentSteps.RECENT  # step durations a rank's recent time is the median of
FLOOR = 0.005  # seconds: shorter steps are not judged


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

    @property
    def ratio(self) -> float:
        return self.seconds / self.median if self.median > 0 else float("inf")

    def message(self) -> str:
        return (f"rank {self.rank} is a straggler: its steps take {self.seconds:.3g} s, the other ranks' "
                f"{self.median:.3g} s (+{(self.ratio - 1) * 100:.0f} %), for {self.steps} steps in a row "
                f"(at step {self.step}; health.straggler_margin)")


class _Rank:
    __slots__ = ("fast", "named", "slow", "value")

    def __init__(self) -> None:
        self.slow = 0  # slow steps in a row
        self.fast = 0  # steps within the margin in a row since it was named
        self.named = False
        self.value: float | None = None  # recent step time, once RECENT steps of the epoch are in


class StragglerDetector:
    """`feed(step_event)` returns a `Straggler` when a rank is named; `recent()` gives every rank's time."""

    def __init__(self, margin: float, steps: int) -> None:
        self.factor = 1.0 + margin
        self.steps = steps
        self.ranks: dict[int, _Rank] = {}
        self.times = RecentSteps()
        self.named_total = 0
        self._sorted: list[float] = []  # every rank's recent time, refreshed about once a job step
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
        r.value = value
        self._fed += 1
        if self._fed >= len(self.ranks):  # O(ranks log ranks) per job step, not per rank step
            self._fed = 0
            self._sorted = sorted(o.value for o in self.ranks.values() if o.value is not None)
        median = _median_without(self._sorted, value)
        if median is None:
            return None
        if median < FLOOR or value <= self.factor * median:
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
        return Straggler(e["rank"], e["step"], value, median, r.slow, e["cycle"], e["iteration"], e["t"])

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
