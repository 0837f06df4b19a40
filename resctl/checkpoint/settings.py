"""The engine's one input: the profile's `[checkpoint]` section (`resctl.profile.schema.Checkpoint`).

Every default and every check of a checkpoint option lives in the schema; `Checkpointer(...)` and
`configure(...)` given keyword options (the schema's Python names: `dir`, `async_`, `writers`, ...)
build the same section from them, so a script that configures the engine by hand gets exactly
what a profile would give, and a bad value is refused with the schema's message.
"""

from __future__ import annotations

import os
from typing import Any

from resctl.profile.schema import Checkpoint as Settings

__all__ = ["Settings", "build"]


def build(base: Settings | None = None, **options: Any) -> Settings:
    """`base` (default: the schema's defaults) with `options` set, validated by the schema.
    Raises `pydantic.ValidationError` (a ValueError) naming the option for a bad or unknown one."""
    if "dir" in options and isinstance(options["dir"], os.PathLike):
        options["dir"] = os.fspath(options["dir"])
    if base is None:
        return Settings(**options)
    if not options:
        return base
    return Settings(**{**base.model_dump(), **options})
