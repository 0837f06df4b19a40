"""The engine's seam to whoever drives it (the shim): a small typed protocol, and the default.

The engine calls, on the training thread unless said otherwise:

- `heartbeat()` before and after each save and, at most once a second, from writer and reader
  threads while a write or a verified read runs (so it must be thread-safe);
- `loaded(step, seconds)` when a `load` returns (step 0: nothing to resume);
- `final_gate(step)` at each step boundary once a final save is requested: True when the final
  save is due at this boundary, False when it comes at a later one (this boundary saves as
  usual and training goes on);
- `after_final()` at the boundary of the final save once it is over.

The shim (`resctl.shim.runtime.Shim`) implements it: heartbeats to the rank monitor, the `resume`
event, and the job's agreed stop step (`resctl.shim.stopstep`). Imports nothing (no torch).
"""

from __future__ import annotations

import enum
from typing import Callable, Protocol


class Hooks(Protocol):
    def heartbeat(self) -> None: ...
    def loaded(self, step: int, seconds: float) -> None: ...
    def final_gate(self, step: int) -> bool: ...
    def after_final(self) -> None: ...


class NoHooks:
    """No driver: an optional plain heartbeat, the final save at the first boundary."""

    def __init__(self, heartbeat: Callable[[], None] | None = None) -> None:
        self.beat = heartbeat

    def heartbeat(self) -> None:
        if self.beat is not None:
            self.beat()

    def loaded(self, step: int, seconds: float) -> None:
        pass

    def final_gate(self, step: int) -> bool:
        return True

    def after_final(self) -> None:
        pass


class Final(enum.Enum):
    """Where the final save (a job stop's) stands."""

    NONE = "none"  # not requested
    REQUESTED = "requested"  # `request_final_save`: due at the boundary `final_gate` allows
    DONE = "done"  # saved, or skipped because the grace was over
