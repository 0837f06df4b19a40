"""SIGTERM in a worker, handled even while the main thread is blocked in native code.

Python runs a signal handler only in the main thread, between bytecodes. A rank whose peer died sits
in an NCCL kernel wait, a CUDA synchronize or a gloo recv that never returns, so a handler there
never runs and the launcher had to wait out its stop timeout. Here the C-level handler Python
installs for a Python-handled signal writes the signal number to a wakeup pipe (from whichever
thread the kernel picked, without the GIL), and a small thread blocked on that pipe acts at once.
The Python-level handler does the same when the main thread gets to it first; whichever comes
first acts, once.

What it does (docs/recovery.md, "Signals"):
- SIGTERM naming this worker in the launcher's restart-stop marker (`resctl.launch.stop`): leave now;
- any other SIGTERM (a stop of the job: preemption, pod deletion, `scancel`): `on_job_stop`, which
  saves at the stop step all ranks agree on (`resctl.shim.stopstep`) within
  `checkpoint.sigterm_grace` and exits 143.
A worker the launcher started with `stop.JOB_STOP_ENV` set (the stop reached the launcher while it
was restarting workers) acts as for a job stop as soon as it is installed (`stop_if_asked`).
A script that installs its own SIGTERM handler owns SIGTERM from then on, as under torchrun.

A process the worker forks (a fork Pool, DataLoader workers) gets SIGTERM and the wakeup fd back as
they were before the shim, as a child of `python script.py` would have them, from its first
instruction: the forking thread blocks SIGTERM across the fork (`os.register_at_fork`), the child
puts the disposition and the wakeup fd back and only then unblocks it. A SIGTERM that reaches the
child sooner (`Pool.terminate()` of a pool whose worker the scheduler has not run yet) waits until
then and ends the child as it would end a fresh interpreter's; it never reaches the shim's handler
or this worker's pipe (a job stop of the worker, exit 143). The parent's mask is put back at once;
a SIGTERM sent to the worker meanwhile is taken by another of its threads.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any, Callable

from resctl.launch import stop
from resctl.patching import Patches


class SigtermWatcher:
    def __init__(self, on_restart_stop: Callable[[], None], on_job_stop: Callable[[], None]) -> None:
        self.on_restart_stop = on_restart_stop
        self.on_job_stop = on_job_stop
        self._once = threading.Lock()
        self._fired = False

    def install(self, patches: Patches) -> None:
        """Main thread only (signal handlers and the wakeup fd can only be set there)."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous_handler = signal.signal(signal.SIGTERM, self._python_handler)
        previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def undo() -> None:
            signal.set_wakeup_fd(previous_fd)
            signal.signal(signal.SIGTERM, previous_handler)
            os.close(write_fd)  # ends the watcher thread's read

        patches.on_undo(undo)
        self._child_undo = (previous_handler, previous_fd, read_fd, write_fd)
        _watchers.append(self)
        patches.on_undo(lambda: _watchers.remove(self) if self in _watchers else None)
        if not _fork_hook_registered:
            _register_fork_hook()
        threading.Thread(target=self._watch, args=(read_fd,), name="resctl-sigterm", daemon=True).start()

    def _in_child(self) -> None:
        """In a process forked from the worker (a fork Pool, DataLoader workers): SIGTERM and the wakeup
        fd as the script left them before the shim, as under torchrun. Otherwise a child's SIGTERM
        (`Pool.terminate()`) was written into this worker's pipe and stopped the worker as a job stop."""
        previous_handler, previous_fd, read_fd, write_fd = self._child_undo
        if signal.getsignal(signal.SIGTERM) == self._python_handler:
            signal.signal(signal.SIGTERM, previous_handler)
        current_fd = signal.set_wakeup_fd(previous_fd)
        if current_fd != write_fd:
            signal.set_wakeup_fd(current_fd)  # not ours any more: the script's own; leave it
        for fd in (read_fd, write_fd):  # the watcher's pipe: no thread reads it here
            try:
                os.close(fd)
            except OSError:
                pass

    def stop_if_asked(self) -> None:
        """Begin the job stop the launcher handed to this worker, if it did."""
        if os.environ.get(stop.JOB_STOP_ENV):
            self.handle()

    def _python_handler(self, _signum: int, _frame: Any) -> None:
        self.handle()

    def _watch(self, read_fd: int) -> None:
        try:
            while data := os.read(read_fd, 64):
                if signal.SIGTERM in data and signal.getsignal(signal.SIGTERM) == self._python_handler:
                    self.handle()
        finally:
            os.close(read_fd)

    def handle(self) -> None:
        with self._once:
            if self._fired:
                return
            self._fired = True
        if stop.is_restart_stop(os.environ, os.getpid()):
            self.on_restart_stop()
        else:
            self.on_job_stop()


_watchers: list[SigtermWatcher] = []  # installed in this process (the fork hook cannot be removed)
_fork_hook_registered = False
_forking = threading.local()  # the forking thread's signal mask from before the fork (`_before_fork`)


def _before_fork() -> None:
    """In the forking thread: SIGTERM blocked until the child has its own disposition back."""
    if _watchers:
        _forking.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])


def _unblock() -> None:
    mask = getattr(_forking, "mask", None)
    if mask is not None:
        del _forking.mask
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _after_fork_in_child() -> None:
    while _watchers:
        _watchers.pop()._in_child()
    _unblock()  # a SIGTERM that came meanwhile acts now, with the disposition a fresh child has


def _register_fork_hook() -> None:
    global _fork_hook_registered
    _fork_hook_registered = True
    os.register_at_fork(before=_before_fork, after_in_parent=_unblock, after_in_child=_after_fork_in_child)
