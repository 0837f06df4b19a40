"""The launcher's late preload (issue 31, item 3; issue 43): a restart that comes before it started does
not import it first; one while it imports waits for it (no fork mid-import); at once where cores are
spare, else only after a restart; abandoned at the job's end."""

from __future__ import annotations

import os
import sys
import threading
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
    monkeypatch.setattr(LatePreload, "mode", "after-restart")  # a cycle after a restart (the rule's second half)
    monkeypatch.setattr(LatePreload, "cycles", 1)
    monkeypatch.setattr(LatePreload, "abandoned", False)
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


@pytest.mark.parametrize(("setting", "cores", "workers", "mode"), [
    ("auto", 2, 1, "late"), ("auto", 2, 2, "late"), ("auto", 3, 1, "at-once"),
    ("auto", 16, 8, "at-once"), ("auto", 192, 8, "at-once"), ("auto", 8, 8, "late"),
    ("at-once", 1, 4, "at-once"), ("after-restart", 192, 1, "after-restart"), ("late", 192, 1, "late")])
def test_the_mode_follows_the_spare_cores_unless_the_profile_says(setting: str, cores: int, workers: int,
                                                                  mode: str) -> None:
    assert preload.choose_mode(setting, cores, workers) == mode


@pytest.mark.parametrize(("cpu_max", "expected"), [
    ("max 100000\n", 64), ("150000 100000\n", 2), ("50000 100000\n", 1), ("800000 100000\n", 8),
    ("9999999 100000\n", 64), ("garbage\n", 64), (None, 64)])
def test_the_usable_cores_are_bounded_by_a_cgroup_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        cpu_max: str | None, expected: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))  # a 64-core node (absent hardware)
    if cpu_max is not None:
        (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
        (tmp_path / "sys/fs/cgroup/cpu.max").write_text(cpu_max)
    assert preload.usable_cores(tmp_path) == expected


def test_after_restart_the_first_workers_never_start_it(late: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that never fails never pays for the import (a 2-core node, a CI box)."""
    monkeypatch.setattr(LatePreload, "cycles", 0)
    LatePreload.workers_started()
    monkeypatch.setattr(LatePreload, "started_at", LatePreload.started_at - preload.LATE_AFTER)  # type: ignore[operator]
    stop.mark_late_imports(os.environ)
    LatePreload.maybe_start()
    assert LatePreload.thread is None and LatePreload.look_within(5.0) == 5.0, "no quicker look either"
    LatePreload.before_fork()  # the first restart
    LatePreload.workers_started()
    monkeypatch.setattr(LatePreload, "started_at", LatePreload.started_at - preload.LATE_AFTER)  # type: ignore[operator]
    LatePreload.maybe_start()
    assert LatePreload.thread is not None
    LatePreload.thread.join()
    assert all(n in sys.modules for n in late)


def test_at_once_starts_with_the_first_workers_without_a_note(late: tuple[str, ...],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LatePreload, "mode", "at-once")
    monkeypatch.setattr(LatePreload, "cycles", 0)
    LatePreload.workers_started()
    assert LatePreload.thread is not None
    LatePreload.before_fork()
    assert all(n in sys.modules for n in late)


def test_the_mode_comes_from_the_plan(late: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"profile": {"launch": {"late_preload": "at-once"}}}')
    monkeypatch.setenv("RESCTL_PLAN", str(plan))
    monkeypatch.setattr(LatePreload, "mode", None)
    LatePreload.workers_started()
    assert LatePreload.mode == "at-once" and LatePreload.thread is not None
    LatePreload.thread.join()


def test_abandoned_at_the_end_the_thread_stops_at_its_next_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  late: tuple[str, ...]) -> None:
    """A package whose body waits, then imports a module of its own: abandoned during the wait, that import
    raises, the thread ends, and nothing it left half-done stays in sys.modules."""
    pkg = tmp_path / "resctl_slow_pkg"
    pkg.mkdir()
    (tmp_path / "resctl_gate.py").write_text("import threading\nentered = threading.Event()\ngo = threading.Event()\n")
    (pkg / "__init__.py").write_text("import resctl_gate\nresctl_gate.entered.set()\nresctl_gate.go.wait(30)\n"
                                     "from resctl_slow_pkg import inner\n")
    (pkg / "inner.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import resctl_gate  # type: ignore[import-not-found]

    monkeypatch.setattr(preload, "LATE_PRELOAD", ("resctl_slow_pkg", late[0]))
    LatePreload.start_now()
    assert resctl_gate.entered.wait(30)
    threading.Timer(0.2, resctl_gate.go.set).start()  # the body goes on while abandon waits for the thread
    LatePreload.abandon(wait=30)
    assert not LatePreload.thread.is_alive()
    assert "resctl_slow_pkg" not in sys.modules and "resctl_slow_pkg.inner" not in sys.modules
    assert late[0] not in sys.modules, "the names after it are not imported"
    assert not any(isinstance(f, preload._Abandoned) for f in sys.meta_path), "the finder leaves with the thread"
    LatePreload.start_now()
    assert LatePreload.thread is not None and not LatePreload.thread.is_alive(), "no new thread after the end"
    sys.modules.pop("resctl_gate", None)
