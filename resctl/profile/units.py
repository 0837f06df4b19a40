"""Durations with units: `90s`, `15m`, `24h`, `1.5d`, `250ms`; a bare number is seconds."""

from __future__ import annotations

import math
import re

_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
MAX_SECONDS = 366 * 86400.0  # longer is a typo (a timer that long never fires); "none" turns a timeout off
_DURATION = re.compile(r"^\s*(-?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|min|m|h|d)?\s*$")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string with a unit. Raises ValueError with the allowed forms."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 15m or 24h, got a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if not match:
            raise ValueError(f"{value!r} is not a duration; use a number of seconds or 250ms, 90s, 15m, 24h, 2d")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        raise ValueError(f"expected a duration such as 90s, 15m or 24h, got {type(value).__name__}")
    if not math.isfinite(seconds):
        raise ValueError(f"{value!r} is not a finite duration; use a number of seconds or 250ms, 90s, 15m, 24h, 2d")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{value!r} is longer than a year; use a shorter duration (or none where a timeout may be off)")
    return seconds


def format_duration(seconds: float) -> str:
    """The shortest exact spelling: 900 -> '15m', 1200 -> '20m', 5 -> '5s', 0.5 -> '500ms'."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and (seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    if seconds < 1 and (seconds * 1000).is_integer():
        return f"{int(seconds * 1000)}ms"
    return f"{seconds:g}s"
