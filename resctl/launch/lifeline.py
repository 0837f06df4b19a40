"""Processes that die with their parent: `resctl run` -> launcher -> workers and rank monitors.

A `resctl run` that is SIGKILLed (an OOM kill, `kill -9`, a node agent) runs no handler, so it
cannot stop its launcher; a launcher SIGKILLed cannot stop its workers. Each child therefore asks
the kernel for a signal when its parent dies (`PR_SET_PDEATHSIG`): the launcher and its workers
get SIGTERM (a job stop: final checkpoint, then exit within the stop's grace), rank monitors
SIGKILL. The parent's PID travels in the environment so a child that starts after its parent
already died (the kernel will not signal it then) notices and signals itself.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import sys
from typing import Mapping

from resctl.profile import contract

PR_SET_PDEATHSIG = 1
RUN_PID_ENV = contract.RUN_PID  # set by `resctl run` for its launcher
LAUNCHER_PID_ENV = contract.LAUNCHER_PID  # set by the launcher for its workers


def die_with_parent(sig: int, expected_parent: int | None = None) -> bool:
    """Get `sig` when the parent process dies; True when it is set up. With `expected_parent`, a
    process whose parent is not (or no longer) that one signals itself at once."""
    parent = os.getppid()
    try:
        if libc().prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # Read again after the prctl: a parent that died before it will never send the signal.
    if parent == 1 or (expected_parent is not None and os.getppid() != expected_parent):
        os.kill(os.getpid(), sig)
    return True


def libc() -> ctypes.CDLL:
    """The C library, by glibc's name first: `find_library` runs `ldconfig -p` in a subprocess (a fork of a
    process that has torch loaded: tens of ms on every worker start)."""
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def expected(env: Mapping[str, str], name: str) -> int | None:
    """The parent PID a child was told to expect in `env[name]` (None when absent or malformed)."""
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def exit_quickly(code: int) -> None:
    """Exit as the interpreter would, less its teardown of every module (torch's takes about 0.5 s in the launcher;
    the CLI's ~40 ms at a job's end): the atexit handlers run (logging's flush, multiprocessing's children, the
    marker file), then the standard streams are flushed."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)
