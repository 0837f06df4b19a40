"""Every signal the launcher's Python handlers catch, kept where no swallowed exception can lose it.

torch elastic's handler turns a SIGTERM into a `SignalException` raised wherever the launcher's main
thread is. Raised inside an at-fork hook (CPython prints and drops exceptions there) or inside one of
NVRx's `except Exception:` blocks, it is gone: the launcher went on supervising workers that trained
on until `resctl run` SIGKILLed it (seen on NVRx 0.7.0 when the stop landed as the workers of a
restart were forked: the first bytecode the parent runs after `os.fork()` is an at-fork hook).

CPython's C-level handler writes the number of every signal it catches to the wakeup fd before any
Python handler runs, whatever that handler then does. `SignalTrace` owns that fd in the launcher:
`take()` reads what arrived since the last call, so the agent's poll (`JobStop.check`) notices a stop
that no exception carried out. A process the launcher forks must not write into this pipe:
`resctl.launch.fork_signals` clears the wakeup fd in the child before it unblocks SIGTERM.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Collection


class SignalTrace:
    """The read end of the launcher's wakeup fd (`fd` is -1 when another owner had it, or off the main thread)."""

    def __init__(self) -> None:
        self.fd = -1

    @classmethod
    def start(cls) -> SignalTrace:
        trace = cls()
        if threading.current_thread() is not threading.main_thread():
            return trace
        read_fd, write_fd = os.pipe()  # not inherited by exec'd children (PEP 446)
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous != -1:  # somebody else's (asyncio in an embedding program): leave it to them
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return trace
        trace.fd = read_fd
        return trace

    def take(self, wanted: Collection[int]) -> int | None:
        """The first of `wanted` caught since the last call (everything that arrived is read)."""
        if self.fd < 0:
            return None
        seen: int | None = None
        while True:
            try:
                data = os.read(self.fd, 512)
            except OSError:  # BlockingIOError: all read
                return seen
            if not data:
                return seen
            if seen is None:
                seen = next((b for b in data if b in wanted), None)
