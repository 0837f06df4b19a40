"""Restarts that make no progress: the pure decision behind `health.no_progress_cycles`.

A launcher cycle made progress when some rank finished a step beyond the best step seen before the
cycle began (a resumed checkpoint's step counts as seen: re-doing rolled-back steps is no progress).
After K cycles in a row without progress, the first included, the job stops instead of restarting:
a script that crashes before its first step, a checkpoint that crashes every load, a rank that dies at
the same step every time spend K cycles, not `launch.max_restarts`. NVRx >= 0.6 counts the same way
(`--ft-max-no-progress-cycles`, cycle 0 included) but only from a checkpoint-iteration file, and never
counts a job that has made no step at all; resctl reads the step events instead (`resctl.health.gate`),
so it holds on every NVRx series, and a job that never reaches its first step is stopped too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NoProgress:
    """Why the job stops: `cycles` cycles in a row ended without a step beyond `best`."""

    cycles: int
    best: int
    limit: int

    def message(self) -> str:
        steps = f"step {self.best}" if self.best else "no step at all"
        return (f"no progress in {self.cycles} launcher cycle(s) in a row (best: {steps}); stopping instead of "
                f"restarting again (health.no_progress_cycles = {self.limit}; 0 turns this stop off)")


class ProgressTracker:
    """Told what each cycle reached as it ends; says when the next one should not start."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.best = 0  # the best step before the next cycle
        self.stalled = 0  # cycles in a row without progress
        self.cycles = 0  # cycles ended

    def cycle_ended(self, reached: int | None, resumed: int | None = None) -> NoProgress | None:
        """`reached`: the highest step any rank finished in the cycle (None: none); `resumed`: the step its
        state was restored from, a baseline for the first cycle (steps continue from it)."""
        if self.cycles == 0 and resumed is not None:
            self.best = max(self.best, resumed)
        self.cycles += 1
        if reached is not None and reached > self.best:
            self.best, self.stalled = reached, 0
        else:
            self.stalled += 1
        if self.limit > 0 and self.stalled >= self.limit:
            return NoProgress(self.stalled, self.best, self.limit)
        return None
