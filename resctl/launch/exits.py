"""The launcher's monitor sleep that ends when a worker exits (Linux pidfds, `poll`), instead of sleeping the
whole monitor interval (5 s by default): `ResctlAgent.sleep` (resctl.launch.agent) calls `sleep_until_exit`."""

from __future__ import annotations

import math
import os
import select
import time
from typing import Any

#: Seconds the peers of a worker that *exited* with a failing code keep running before the launcher
#: looks (and stops them): torchrun's monitor interval, so a peer's last lines (its own traceback,
#: an exit message) reach the console at least as often as under torchrun. A worker killed by a
#: signal (kill -9, OOM, segfault) gets no grace: that is the fast-recovery path.
PEER_GRACE = 0.1


def _exited_failing(pid: int) -> bool:
    """`pid` (a child) has exited with a code other than 0 (not killed by a signal); not reaped."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except (ChildProcessError, OSError):  # not our child, or reaped meanwhile
        return False
    return info is not None and info.si_code == os.CLD_EXITED and info.si_status != 0


def sleep_until_exit(pids: list[int], result_fds: list[int], seconds: float, clock: Any = time, *,
                     after_look: bool = False) -> None:
    """Sleep `seconds`, or until one of `pids` (children) exits or a result fd becomes readable;
    `PEER_GRACE` more when the child exited with a failing code. `after_look`: the sleep right after the
    monitor looked at the workers, where a child that has exited meanwhile (not reaped: the monitor has
    not seen it) ends the sleep at once. Slept through, it held a job's end back by the whole monitor
    interval (5 s by default) whenever the last worker exited between the look and the sleep. Other
    sleeps (NVRx's waits while it stops workers) do not end on a child that had exited before them."""
    fds: dict[int, int] = {}
    try:
        for pid in pids:
            try:
                fds[os.pidfd_open(pid)] = pid
            except OSError:  # gone and reaped, or no pidfd on this kernel
                continue
        start = clock.monotonic()
        exited = readable(list(fds), 0) if fds else []
        alive = [fd for fd in fds if fd not in exited]
        if after_look and exited:
            woke = exited
        elif not alive:
            clock.sleep(seconds)
            return
        else:
            woke = readable(alive + result_fds, seconds)
        if any(fd in fds and _exited_failing(fds[fd]) for fd in woke):
            clock.sleep(max(0.0, min(PEER_GRACE, seconds - (clock.monotonic() - start))))
    finally:
        for fd in fds:
            os.close(fd)


def readable(fds: list[int], seconds: float) -> list[int]:
    """The fds readable (a pidfd: its process exited) within `seconds`: poll, which takes any fd number
    (select refuses one of 1024 or more, which a launcher with many files open reaches)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    return [fd for fd, _ in poller.poll(math.ceil(max(0.0, seconds) * 1000))]
