"""The fault drills, once: every kind, what it does, and the `KIND@STEP[:RANK]` spelling.

The profile schema's `Fault.kind`, `RESCTL_FAULTS` parsing (`resctl.profile.load`), the shim's
drill schedule and dispatch (`resctl.shim.faults`, `resctl.shim.runtime`) and the `fault` event's
causes (`resctl.telemetry.events`) all derive from `KINDS`. Adding a drill: add it to `FaultKind`
and `DRILLS`, then give the shim its action (`resctl.shim.runtime.DRILL_ACTIONS`, checked against
`KINDS` at import). Imports nothing (the profile and the launcher use it; no torch).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

#: Every drill kind; the order is the order drills due at one step fire in.
FaultKind = Literal["exception", "sigkill", "hang", "checkpoint_exception"]
KINDS: tuple[FaultKind, ...] = get_args(FaultKind)

#: What each drill does (docs, `--help`, the schema's description).
DRILLS: dict[FaultKind, str] = {
    "exception": "raise in the training step (in-process restart or the launcher recovers)",
    "sigkill": "the rank kills itself with SIGKILL (only the launcher can recover)",
    "hang": "the rank stops making progress (heartbeat/progress timeouts detect it)",
    "checkpoint_exception": "the next checkpoint write fails part-way",
}
assert tuple(DRILLS) == KINDS, "every drill kind needs a description, in KINDS order"

#: The `fault` event's causes: a drill's kind, or what a real fault was.
CAUSES: tuple[str, ...] = ("exception", "exit", *(k for k in KINDS if k != "exception"), "sigterm")


def parse_schedule(text: str) -> list[dict[str, Any]]:
    """`'sigkill@30:1,exception@50'` -> `[{'kind': 'sigkill', 'step': 30, 'rank': 1}, ...]`."""
    out: list[dict[str, Any]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, at, where = item.partition("@")
        if not at:
            raise ValueError(f"{item!r}: expected KIND@STEP[:RANK]")
        if kind not in KINDS:
            raise ValueError(f"{item!r}: unknown fault kind {kind!r}; kinds are {', '.join(KINDS)}")
        step, _, rank = where.partition(":")
        try:
            out.append({"kind": kind, "step": int(step), "rank": int(rank) if rank else 0})
        except ValueError:
            raise ValueError(f"{item!r}: STEP and RANK must be integers") from None
    return out
