"""The launcher's monitor sleep (`exits.sleep_until_exit`, the agent's sleep) with real child processes: it wakes
when a worker exits; after `PEER_GRACE` when the worker exited with a failing code (its peers' last
lines get torchrun's 0.1 s), at once when a signal killed it (the fast-recovery path)."""

from __future__ import annotations

import os
import signal
import time
from typing import Iterator

import pytest

from resctl.launch import exits


def _child(action: str) -> int:
    pid = os.fork()
    if pid == 0:  # the worker: wait for the parent's sleep to start, then end as told
        time.sleep(0.3)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3 if action == "fail" else 0)
    return pid


@pytest.fixture
def workers() -> Iterator[list[int]]:
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def _exit_to_wake(workers: list[int], action: str) -> tuple[float, int]:
    """Seconds from the child's end to the sleep's return, and the child's status (still unreaped)."""
    pid = _child(action)
    workers.append(pid)
    woke_after_start = time.monotonic()
    exits.sleep_until_exit(workers, [], 20.0)
    woke = time.monotonic()
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    assert info is not None, "the sleep returned before the worker ended"
    assert woke - woke_after_start < 15.0, "the sleep did not wake on the worker's end"
    return woke, info.si_status


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")
def test_a_failing_exit_gives_the_peers_torchruns_poll_interval(workers: list[int]) -> None:
    t0 = time.monotonic()
    woke, status = _exit_to_wake(workers, "fail")
    assert status == 3
    # The child ended >= 0.3 s after t0; the sleep returned at least PEER_GRACE after that.
    assert woke - t0 >= 0.3 + exits.PEER_GRACE


class _RecordingTime:
    """The real time module, with the sleeps the monitor's sleep makes itself recorded."""

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        time.sleep(seconds)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")
@pytest.mark.parametrize("action,status,grace", [("fail", 3, True), ("kill", signal.SIGKILL, False), ("ok", 0, False)])
def test_only_a_failing_exit_gets_the_grace(workers: list[int], action: str, status: int, grace: bool) -> None:
    pid = _child(action)
    workers.append(pid)
    clock = _RecordingTime()
    exits.sleep_until_exit(workers, [], 20.0, clock)
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    assert info is not None and info.si_status == status
    assert exits._exited_failing(pid) is grace
    assert len(clock.sleeps) == int(grace) and all(0 < s <= exits.PEER_GRACE for s in clock.sleeps), clock.sleeps
    assert not exits._exited_failing(os.getpid())  # not a child: never a grace


class _Clock(_RecordingTime):
    """Records the sleeps and makes none (the blind sleep of a whole interval is what is checked)."""

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


def _exited_child(code: int) -> int:
    """A child that has exited with `code` and is not reaped (a zombie: the monitor has not seen it)."""
    pid = os.fork()
    if pid == 0:
        os._exit(code)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # blocks until it exits; leaves it unreaped
    return pid


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")
@pytest.mark.parametrize("code,sleeps", [(0, []), (3, [exits.PEER_GRACE])])
def test_a_worker_that_exited_after_the_monitors_look_ends_the_next_sleep_at_once(
        workers: list[int], code: int, sleeps: list[float]) -> None:
    # The last worker of a finished job exits between the monitor's look and its sleep: the sleep used to
    # run its whole interval (a job's end held back by 5 s, the default monitor interval).
    workers.append(_exited_child(code))
    clock = _Clock()
    exits.sleep_until_exit(workers, [], 20.0, clock, after_look=True)
    assert clock.sleeps == pytest.approx(sleeps, abs=0.05)


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="no pidfd on this platform")
def test_other_sleeps_do_not_end_on_a_worker_that_had_exited_before_them(workers: list[int]) -> None:
    # NVRx's own waits while it stops workers sleep through the launcher's clock too: a worker already
    # gone must not turn them into a busy loop.
    workers.append(_exited_child(0))
    clock = _Clock()
    exits.sleep_until_exit(workers, [], 20.0, clock)
    assert clock.sleeps == [20.0]


def test_a_result_fd_numbered_past_1024_wakes_the_sleep(workers: list[int]) -> None:
    """A launcher with many files open hands fds of 1024 and more (select refuses them: ValueError)."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1600:
        pytest.skip("the open-files limit is under 1600")
    read, write = os.pipe()
    high = os.dup2(read, 1500)
    try:
        workers.append(_child("ok"))
        os.write(write, b"x")  # a result is ready now: the sleep ends at once, not after 60 s
        began = time.monotonic()
        exits.sleep_until_exit(workers, [high], 60.0)
        assert time.monotonic() - began < 50.0
    finally:
        for fd in (read, write, high):
            os.close(fd)
