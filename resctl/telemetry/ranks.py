"""Per-rank step times and stragglers of a run, for `resctl report` (streamed beside the goodput analysis).

Each rank's step durations go into a log-bucketed histogram (2 % wide: the median is exact to 1 %,
memory is bounded by the spread of step times, not by the steps); the first step of each cycle or
in-process iteration is left out (it holds the start and the load), as the straggler detector does.
A rank's `ratio` is its median over the median of the other ranks' medians (of its own work outside the
collectives it waits in, the step events' `busy`, when every rank has it); `named` counts the
`straggler` events the health watch wrote for it (docs/recovery.md, "Health").
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

_WIDTH = math.log(1.02)


@dataclass
class _Rank:
    steps: int = 0
    total: float = 0.0
    buckets: dict[int, int] = field(default_factory=dict)
    busy: dict[int, int] = field(default_factory=dict)  # the same histogram of the steps' `busy` (DDP)
    epoch: tuple[int, int] | None = None
    named: int = 0
    named_at: int | None = None  # step of the first straggler event

    def median(self) -> float | None:
        return _median(self.buckets)

    def busy_median(self) -> float | None:
        return _median(self.busy)


def _bucket(d: float) -> int:
    return math.floor(math.log(d) / _WIDTH)


def _median(buckets: dict[int, int]) -> float | None:
    if not buckets:
        return None
    half, seen = sum(buckets.values()) / 2, 0
    for b in sorted(buckets):
        seen += buckets[b]
        if seen >= half:
            return math.exp((b + 0.5) * _WIDTH)
    return None  # pragma: no cover - the loop always reaches half


class RankSteps:
    def __init__(self) -> None:
        self.ranks: dict[int, _Rank] = {}

    def watch(self, events: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """The same events, fed to this table on the way (one pass for the report)."""
        for e in events:
            self.feed(e)
            yield e

    def feed(self, e: dict[str, Any]) -> None:
        kind = e["kind"]
        if kind not in ("step", "straggler"):
            return
        r = self.ranks.get(e["rank"])
        if r is None:
            r = self.ranks[e["rank"]] = _Rank()
        if kind == "straggler":
            r.named += 1
            r.named_at = e["step"] if r.named_at is None else r.named_at
            return
        epoch = (e["cycle"], e["iteration"])
        if epoch != r.epoch:
            r.epoch = epoch
            return
        d = e["duration"]
        r.steps += 1
        r.total += d
        if d > 0:
            b = _bucket(d)
            r.buckets[b] = r.buckets.get(b, 0) + 1
        busy = e.get("busy")
        if busy is not None and busy > 0:
            b = _bucket(busy)
            r.busy[b] = r.busy.get(b, 0) + 1

    def rows(self) -> list[dict[str, Any]]:
        """One row per rank: steps, mean and median step seconds, median own work (`busy`, DDP), ratio to the
        others (of own work when every rank has it: in a synchronous job step times are all the slowest's),
        straggler events."""
        busy = {rank: r.busy_median() for rank, r in self.ranks.items()}
        by_busy = bool(busy) and all(m is not None for m in busy.values())
        medians = busy if by_busy else {rank: r.median() for rank, r in self.ranks.items()}
        out = []
        for rank, r in sorted(self.ranks.items()):
            others = [m for k, m in medians.items() if k != rank and m is not None]
            mine = medians[rank]
            ratio = mine / statistics.median(others) if mine is not None and others and statistics.median(others) > 0 else None
            out.append({"rank": rank, "steps": r.steps, "mean_s": r.total / r.steps if r.steps else None,
                        "median_s": r.median(), "busy_median_s": busy[rank], "ratio": ratio,
                        "ratio_of": "busy" if by_busy else "step", "straggler_events": r.named,
                        "named_at_step": r.named_at})
        return out


class RecentSteps:
    """Each rank's recent step time (median of its last `RECENT` steps, the first of an epoch left out):
    what `resctl_rank_step_seconds{rank}` shows and what the straggler detector judges."""

    RECENT = 5

    def __init__(self) -> None:
        self._recent: dict[int, deque[float]] = {}
        self._busy: dict[int, deque[float]] = {}  # the step events' `busy`: own work outside the waits
        self._epoch: dict[int, tuple[int, int]] = {}

    def feed(self, e: dict[str, Any]) -> float | None:
        """Take one step event; the rank's recent time, or None for the first step of an epoch."""
        rank, epoch = e["rank"], (e["cycle"], e["iteration"])
        recent = self._recent.get(rank)
        if recent is None:
            recent = self._recent[rank] = deque(maxlen=self.RECENT)
            self._busy[rank] = deque(maxlen=self.RECENT)
        busy = self._busy[rank]
        if self._epoch.get(rank) != epoch:
            self._epoch[rank] = epoch
            recent.clear()
            busy.clear()
            return None
        recent.append(e["duration"])
        if e.get("busy") is None:
            busy.clear()  # a step not timed: the rank's busy time no longer describes it
        else:
            busy.append(e["busy"])
        return statistics.median(recent)

    def busy(self, rank: int) -> float | None:
        """The rank's recent own work a step (median of its last RECENT `busy` values), once it has them all."""
        busy = self._busy.get(rank, ())
        return statistics.median(busy) if len(busy) >= self.RECENT else None

    def full(self, rank: int) -> bool:
        """The rank's recent time holds RECENT steps of its epoch."""
        return len(self._recent.get(rank, ())) >= self.RECENT

    def recent(self) -> dict[int, float]:
        return {rank: statistics.median(d) for rank, d in sorted(self._recent.items()) if d}
