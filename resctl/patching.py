"""Owned, undoable patches of other libraries (torch, NVRx, the standard library).

resctl changes a few attributes of code it does not own: the launcher's worker stop, the shim's
`init_process_group`, NVRx's rank-monitor client, multiprocessing's spawn preparation. Every such
change goes through a `Patches` set, which remembers the original value so that `undo()` puts each
attribute back exactly (in reverse order), and so that a test can install and remove them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

_MISSING = object()


@dataclass
class _Change:
    owner: Any
    name: str
    original: Any


@dataclass
class Patches:
    """A named set of attribute replacements and undo callbacks, undone last-in first-out."""

    name: str
    _changes: list[_Change | Callable[[], None]] = field(default_factory=list)

    def set(self, owner: Any, name: str, value: Any) -> Any:
        """Replace `owner.name` by `value`; returns the original (what `value` usually wraps)."""
        effective = getattr(owner, name, _MISSING)  # what callers saw, inherited or not
        original = owner.__dict__.get(name, _MISSING) if isinstance(owner, type) else effective
        self._changes.append(_Change(owner, name, original))
        if callable(value) and effective is not _MISSING and not hasattr(value, "__wrapped__"):
            try:
                value.__wrapped__ = effective
            except (AttributeError, TypeError):
                pass
        setattr(owner, name, value)
        return None if effective is _MISSING else effective

    def on_undo(self, callback: Callable[[], None]) -> None:
        """Run `callback` at `undo()` (for changes that are not attributes: hooks, handlers)."""
        self._changes.append(callback)

    @property
    def applied(self) -> list[str]:
        return [f"{_owner_name(c.owner)}.{c.name}" for c in self._changes if isinstance(c, _Change)]

    def undo(self) -> None:
        while self._changes:
            change = self._changes.pop()
            if callable(change) and not isinstance(change, _Change):
                change()
            elif change.original is _MISSING:
                try:
                    delattr(change.owner, change.name)
                except AttributeError:
                    pass
            else:
                setattr(change.owner, change.name, change.original)

    def __bool__(self) -> bool:
        return bool(self._changes)


def _owner_name(owner: Any) -> str:
    return getattr(owner, "__qualname__", None) or getattr(owner, "__name__", None) or type(owner).__name__
