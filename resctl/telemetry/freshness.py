"""Durable checkpoints and their freshness, one accumulator of `goodput.Analyzer`: which steps are
durable, how old the newest was at every reference-rank step, and the bounded series of those ages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from resctl.telemetry.calibration import Mean
from resctl.telemetry.epochs import EpochKey

SERIES_CAP = 2000  # points of the goodput / freshness series


class Point(NamedTuple):  # a tuple: made at every kept reference step, so cheap to create
    """One reference-rank step as the series keeps it (goodput is computed at the end)."""

    t: float
    step: int
    epoch: EpochKey
    age_steps: int
    age_s: float


@dataclass
class Freshness:
    history: bool  # keep the series (the report; not the metrics)
    durable_steps: set[int] = field(default_factory=set)
    snapshot_steps: set[int] = field(default_factory=set)  # of those: the script's own torch.save
    latest: tuple[float, int] | None = None  # (t, step) of the newest durable checkpoint
    age_steps: Mean = field(default_factory=Mean)
    age_s: Mean = field(default_factory=Mean)
    age_steps_max: float | None = None
    age_s_max: float | None = None
    series: list[Point] = field(default_factory=list)
    series_stride: int = 1
    ref_steps: int = 0

    def durable(self, t: float, step: int) -> None:
        self.durable_steps.add(step)
        if self.latest is None or t >= self.latest[0]:
            self.latest = (t, step)  # the newest by time: after a rollback that is the one a restart loads

    def step(self, epoch: EpochKey, t: float, step: int, t0: float) -> None:
        """A reference-rank step at `t`; `t0` the run's start (the age when nothing is durable yet)."""
        latest = self.latest
        age_steps = step - (latest[1] if latest else 0)
        age_s = t - (latest[0] if latest else t0)
        ages, secs = self.age_steps, self.age_s  # Mean.add inlined: once per reference step
        ages.total += age_steps
        ages.n += 1
        secs.total += age_s
        secs.n += 1
        self.age_steps_max = age_steps if self.age_steps_max is None else max(self.age_steps_max, age_steps)
        self.age_s_max = age_s if self.age_s_max is None else max(self.age_s_max, age_s)
        if self.history and self.ref_steps % self.series_stride == 0:
            self.series.append(Point(t, step, epoch, age_steps, age_s))
            if len(self.series) > SERIES_CAP:
                del self.series[1::2]
                self.series_stride *= 2
        self.ref_steps += 1

    def stats(self) -> dict[str, float | None]:
        return {"mean_age_steps": self.age_steps.mean(), "max_age_steps": self.age_steps_max,
                "mean_age_s": self.age_s.mean(), "max_age_s": self.age_s_max}
