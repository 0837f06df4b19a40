"""Fault drills: a deterministic schedule of injected faults, each fired once per run.

A schedule comes from the profile's `[faults] schedule` or `RESCTL_FAULTS`, spelled
`KIND@STEP[:RANK],...`, e.g. `sigkill@30:1,exception@50,hang@70:0`. The kinds, what each does
and the parser are `resctl.drills` (one registry for the schema, this module and the shim).

"Once per run" survives restarts: a fault that fired leaves a marker in the run directory, so
resuming from a checkpoint before its step does not fire it again.

Free of torch (the launcher's side reads schedules too).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from resctl.drills import KINDS, FaultKind, parse_schedule

__all__ = ["KINDS", "FaultKind", "FaultPlan", "InjectedFault", "parse_schedule"]


class InjectedFault(RuntimeError):
    """Raised by an `exception` drill; the message names the drill so logs are unambiguous."""


class FaultPlan:
    """The faults due for one rank, with fired-once markers under `<run_dir>/faults/`."""

    def __init__(self, schedule: list[dict[str, Any]], rank: int, run_dir: str | os.PathLike[str] | None) -> None:
        self.rank = rank
        self._marks = Path(run_dir) / "faults" if run_dir else None
        self._due = {
            (f["step"], f["kind"]): i for i, f in enumerate(schedule) if int(f.get("rank", 0)) == rank
        }

    def __bool__(self) -> bool:
        return bool(self._due)

    def take(self, step: int, kind: str) -> bool:
        """True exactly once per run for a fault scheduled at this step, rank and kind."""
        index = self._due.get((step, kind))
        if index is None:
            return False
        if self._marks is not None:
            self._marks.mkdir(parents=True, exist_ok=True)
            try:
                # O_EXCL makes "fired" atomic even if two incarnations race.
                os.close(os.open(self._marks / f"{index}-{kind}-step{step}-rank{self.rank}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return False
        del self._due[(step, kind)]
        return True

    def pending(self, kind: str) -> list[int]:
        return sorted(step for step, k in self._due if k == kind)
