"""The launcher's late preload (issue 31, item 3): a restart that comes before it started does
not import it first; one while it imports waits for it (no fork mid-import)."""

from __future__ import annotations

import sys
from typing import Iterator

import pytest

from resctl.launch import preload
from resctl.launch.preload import LatePreload


@pytest.fixture
def late(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, ...]]:
    """A fresh LatePreload importing two small standard modules not loaded yet."""
    names = tuple(n for n in ("colorsys", "sndhdr", "this", "antigravity", "xdrlib", "nntplib", "tabnanny")
                  if n not in sys.modules)[:2]
    monkeypatch.setattr(preload, "LATE_PRELOAD", names)
    monkeypatch.setenv("RESCTL_PRELOAD", "1")
    monkeypatch.setattr(LatePreload, "thread", None)
    monkeypatch.setattr(LatePreload, "started_at", None)
    yield names
    if LatePreload.thread is not None:
        LatePreload.thread.join()
    for n in names:
        sys.modules.pop(n, None)


def test_a_restart_before_the_thread_started_imports_nothing_first(late: tuple[str, ...]) -> None:
    """The restarted workers do not wait for the late modules (their script imports what it
    uses, as the first workers' did); the clock starts again with them."""
    LatePreload.workers_started()
    LatePreload.before_fork()
    assert LatePreload.thread is None and LatePreload.started_at is None
    assert not any(n in sys.modules for n in late)
    LatePreload.workers_started()
    assert LatePreload.started_at is not None


def test_a_restart_while_the_thread_imports_forks_only_after_it(late: tuple[str, ...],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    LatePreload.workers_started()
    monkeypatch.setattr(LatePreload, "started_at", LatePreload.started_at - preload.LATE_AFTER)  # type: ignore[operator]
    LatePreload.maybe_start()
    assert LatePreload.thread is not None
    LatePreload.before_fork()  # joins it: the fork sees the modules whole
    assert not LatePreload.thread.is_alive() and all(n in sys.modules for n in late)


def test_without_forked_workers_nothing_is_imported(late: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESCTL_PRELOAD")
    LatePreload.start_now()
    assert LatePreload.thread is None
