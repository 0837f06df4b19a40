"""The launcher's late preload (issue 31, item 3): a restart that comes before it started does
not import it first; one while it imports waits for it (no fork mid-import)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

from resctl.launch import preload, stop
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
    marker = stop.file_for(os.getpid())  # the launcher's private directory, where its workers leave notes
    monkeypatch.setenv(stop.ENV, str(marker))
    yield names
    stop.remove(marker)
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
    stop.mark_late_imports(os.environ)  # a worker's script imported them
    LatePreload.maybe_start()
    assert LatePreload.thread is not None
    LatePreload.before_fork()  # joins it: the fork sees the modules whole
    assert not LatePreload.thread.is_alive() and all(n in sys.modules for n in late)


def test_without_forked_workers_nothing_is_imported(late: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RESCTL_PRELOAD")
    LatePreload.start_now()
    assert LatePreload.thread is None


def test_only_a_worker_that_imported_them_starts_the_thread(late: tuple[str, ...],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that never builds an optimizer leaves the launcher without them (its first step says)."""
    LatePreload.workers_started()
    monkeypatch.setattr(LatePreload, "started_at", LatePreload.started_at - preload.LATE_AFTER)  # type: ignore[operator]
    LatePreload.note_imported()  # this process has none of them: no note
    LatePreload.maybe_start()
    assert LatePreload.thread is None and not LatePreload.wanted()
    __import__(late[0])  # now it has one, as a worker whose script built an optimizer
    LatePreload.note_imported()
    assert LatePreload.wanted()
    LatePreload.maybe_start()
    assert LatePreload.thread is not None


def test_a_note_in_another_users_or_a_shared_directory_is_not_believed(late: tuple[str, ...], tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv(stop.ENV, str(shared / "marker"))
    (shared / stop.LATE_IMPORTS).write_text("1")
    assert not LatePreload.wanted()


def test_the_monitor_looks_for_the_note_often_while_it_may_come(late: tuple[str, ...],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Not once a monitor interval (5 s): a GPU job's first step, which writes the note, comes seconds after its
    start, and an import begun up to 5 s later overlapped the first seconds of training (a kill -9 there waited
    for the rest of it: ~2 s more on one H200)."""
    assert LatePreload.look_within(5.0) == 5.0, "no workers yet"
    LatePreload.workers_started()
    assert LatePreload.look_within(5.0) == preload.LATE_LOOK
    assert LatePreload.look_within(0.1) == 0.1, "a shorter interval is kept"
    monkeypatch.setattr(LatePreload, "started_at", LatePreload.started_at - preload.LATE_LOOK_FOR)  # type: ignore[operator]
    assert LatePreload.look_within(5.0) == 5.0, "a job that never stepped: the monitor interval again"
    monkeypatch.setattr(LatePreload, "started_at", LatePreload.started_at + preload.LATE_LOOK_FOR - preload.LATE_AFTER)  # type: ignore[operator]
    stop.mark_late_imports(os.environ)
    LatePreload.maybe_start()
    assert LatePreload.thread is not None and LatePreload.look_within(5.0) == 5.0, "started: nothing to look for"
    LatePreload.thread.join()
    monkeypatch.setattr(LatePreload, "thread", None)
    monkeypatch.delenv("RESCTL_PRELOAD")
    assert LatePreload.look_within(5.0) == 5.0, "exec'd workers: no preload"
