"""resctl.checkpoint — async, atomic, verified checkpoints for a training loop.

Use it from a training script (the resctl shim configures it from the profile's
`[checkpoint]` section; without the shim the first call configures defaults)::

    import resctl.checkpoint as ckpt

    state = {"model": model, "optim": optimizer, "data": {"epoch": 0}}
    start = ckpt.load(state)                  # newest valid checkpoint restored in place; 0 if none
    for step in range(start + 1, total + 1):
        train_one_step()
        ckpt.maybe_save(state, step)          # every `interval_steps`; returns once staged
    ckpt.wait()                               # make the last write durable

Functions (all act on the module's default `Checkpointer`):

- `configure(settings=None, **options) -> Checkpointer`: options are the `[checkpoint]` keys
  (`dir`, `interval_steps`, `async_`, `writers`, ...: defaults and checks are the profile
  schema's) and `rank`, `world_size`, `events`, `hooks`, `heartbeat`, `run_id`, `exclusive`
- `load(state) -> int`, `save(state, step)`, `maybe_save(state, step) -> bool`,
  `save_final() -> int | None`, `wait()`, `get() -> Checkpointer`.

A DataLoader or sampler in `state` is saved as its data position and resumed mid-epoch (the next
pass yields the batches the uninterrupted run would have; `resctl.checkpoint.dataposition`); with
the profile's `checkpoint.data_position = true` every loader of the script is, with no edit.
Values in `state` with `state_dict()`/`load_state_dict()` go through them; other values are
saved as they are and replaced on load. Only tensors, containers and plain values may be in
the state: loading is always `weights_only=True`. A checkpoint becomes visible only when
complete, and `load` skips (and reports) incomplete or corrupt ones. See docs/checkpoint.md.
"""

from __future__ import annotations

import threading
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from resctl.checkpoint.errors import (
    CheckpointDirInUse,
    CheckpointError,
    CheckpointMismatch,
    SaveFailuresExceeded,
)

if TYPE_CHECKING:  # the engine imports torch: loaded on first use, so `resctl run` can check a dir without it
    from resctl.checkpoint.engine import Checkpointer
    from resctl.checkpoint.settings import Settings

__all__ = [
    "CheckpointDirInUse",
    "CheckpointError",
    "CheckpointMismatch",
    "Checkpointer",
    "SaveFailuresExceeded",
    "configure",
    "get",
    "load",
    "maybe_save",
    "save",
    "save_final",
    "wait",
]

_default: Checkpointer | None = None
_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name == "Checkpointer":
        from resctl.checkpoint.engine import Checkpointer

        return Checkpointer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def configure(settings: Settings | None = None, **options: Any) -> Checkpointer:
    """Set (and return) the default Checkpointer; a previous one finishes its writes first.

    Takes what `Checkpointer(...)` takes: a `[checkpoint]` section and/or its keys as keyword
    options (`dir`, `interval_steps`, `async_`, `writers`, ...; defaults and checks: the profile
    schema), plus `rank`, `world_size`, `events`, `hooks`, `heartbeat`, `run_id`, `exclusive`."""
    from resctl.checkpoint.engine import Checkpointer

    return set_default(Checkpointer(settings, **options))


def set_default(checkpointer: Checkpointer) -> Checkpointer:
    """Install an existing Checkpointer (e.g. `Checkpointer.from_section(...)`) as the default."""
    global _default
    with _lock:
        old, _default = _default, checkpointer
    if old is not None and old is not checkpointer:
        old.close()
    return checkpointer


def get() -> Checkpointer:
    """The default Checkpointer, configured with defaults (`dir="checkpoints"`) on first use."""
    from resctl.checkpoint.engine import Checkpointer

    global _default
    with _lock:
        if _default is None:
            _default = Checkpointer(dir="checkpoints")
        return _default


def load(state: MutableMapping[str, Any]) -> int:
    """Restore the newest valid checkpoint into `state` in place; return its step (0: none)."""
    from resctl.checkpoint import dataposition

    ck = get()
    full = dataposition.with_positions(state, ck.events)
    step = ck.load(full)
    if full is not state:
        dataposition.copy_back(full, state)
    return step


def save(state: MutableMapping[str, Any], step: int) -> None:
    """Save `state` as `step` now (returns once staged when async)."""
    from resctl.checkpoint import dataposition

    ck = get()
    ck.save(dataposition.with_positions(state, ck.events), step)


def maybe_save(state: MutableMapping[str, Any], step: int) -> bool:
    """Save when `step % interval_steps == 0`; return whether it saved."""
    from resctl.checkpoint import dataposition

    ck = get()
    return ck.maybe_save(dataposition.with_positions(state, ck.events), step)


def save_final() -> int | None:
    """Finish the write in flight and save the last `maybe_save` state if its step is not saved."""
    return get().save_final()


def wait() -> None:
    """Block until every write is durable; raise CheckpointError if one failed."""
    if _default is not None:
        _default.wait()
