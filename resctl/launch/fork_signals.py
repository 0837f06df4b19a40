"""A process the launcher forks dies of SIGTERM from its first instruction, as a fresh `python` would.

A forked worker (and a rank monitor) inherits the launcher's Python SIGTERM handler, torch elastic's
(resctl's `_stops_never_lost` behind it), until `resctl.shim.forked.reset` puts the defaults back. A
SIGTERM that reached a worker in that window ran the launcher's handler in the worker: it raised the
launcher's `SignalException` in whatever the child was running (an at-fork hook, which swallows it; the
preload), or, while the launcher was restarting, only remembered it. The worker then lived on into its
script, blocked in `init_process_group` for a peer that had died, until the launcher's `--term-timeout`
(60 s) SIGKILLed it: a stop that lands while workers are being forked took a minute instead of a second.

Here SIGTERM is blocked in the forking thread across `os.fork()`; the child sets SIGTERM's disposition to
the default before it unblocks it, so a SIGTERM sent meanwhile waits, then ends the child at once. The
launcher's own mask is put back as soon as the fork returns (a SIGTERM sent to it meanwhile is delivered
then). What the child does later (the shim's own SIGTERM handling, a rank monitor's handler) is its own.
"""

from __future__ import annotations

import os
import signal
import threading

_state = threading.local()  # the forking thread's mask from before the fork
_installed: list[int] = []  # the pid that installed the hooks (a forked child inherits them)


def install() -> None:
    """In the launcher, once (the hooks cannot be removed; they act only in the process that installed them)."""
    if _installed:
        return
    _installed.append(os.getpid())
    os.register_at_fork(before=_before, after_in_parent=_restore, after_in_child=_child)


def _before() -> None:
    if _installed and os.getpid() == _installed[0]:
        _state.mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])


def _restore() -> None:
    mask = getattr(_state, "mask", None)
    if mask is not None:
        del _state.mask
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _child() -> None:
    if getattr(_state, "mask", None) is None:
        return  # not a fork of the launcher (a worker's own fork inherits the hooks)
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)  # the launcher's (resctl.launch.signal_trace): not this child's to write
    finally:
        _restore()
