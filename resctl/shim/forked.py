"""A worker forked from the launcher, made into what a new interpreter would be.

`launch.worker_start = "fork"` starts each worker as a fork of the launcher, after the launcher
imported torch (`resctl.launch.preload`). The fork inherits more than memory: the launcher's
process-wide settings, which a script run by `python script.py` (torchrun) never sees. `reset()`
puts back what a new interpreter starts with, before the shim or the script runs:

- **atexit**: the launcher's exit handlers are dropped (a worker must not clear the launcher's
  files); the handlers that modules register when imported (logging's flush, torch's DataLoader
  flag, weakref finalizers, ...), recorded while the launcher imported them, are registered again,
  so that a fresh interpreter's exit handlers run at the worker's end (`resctl.shim.ending`).
  Weakref finalizers of the launcher's objects are no longer called at exit.
- **logging**: the root logger without the launcher's handlers, at WARNING; the default record
  factory; warnings no longer captured into the launcher's log (`logging.basicConfig` works).
- **warnings**: `showwarning` is the standard one again; "once"/"default" registries forgotten, so a
  warning the launcher saw is shown again by the worker, as by a new process; the warnings raised
  while the launcher imported torch for the workers are shown again (through the worker's filters).
- **hooks**: `sys.excepthook`, `threading.excepthook`, `sys.unraisablehook` are the defaults; the
  fault handler (enabled by torch elastic's error handler in the launcher) is off unless
  `PYTHONFAULTHANDLER` or `-X faulthandler` asks for it.
- **signals**: every Python handler the launcher installed (torch elastic's, for SIGINT, SIGTERM,
  SIGHUP, SIGQUIT) is back to the default, SIGINT raises KeyboardInterrupt, no signal is blocked,
  no wakeup fd; ignored signals stay ignored (as they would across an exec).
- **random**: Python's `random`, NumPy's global generator and torch's CPU generator seeded from the
  OS, as a new process seeds them: every worker has its own streams, and new ones after a restart.
- **stdin**: multiprocessing replaced it by /dev/null; a worker reads the launcher's stdin, as
  torchrun's do.
- **multiprocessing**: the worker is `MainProcess` with no parent and no start method chosen, not
  the launcher's `ForkProcess-N`.

What a fork cannot give: the str/bytes hash seed (fixed when the launcher started, so the same on
every rank: set PYTHONHASHSEED, or `launch.worker_start = "exec"`), the launcher's imported modules
and open file descriptors (README, "Differences from torchrun").
"""

from __future__ import annotations

import atexit
import faulthandler
import itertools
import os
import pickle
import random
import signal
import sys
import threading
import traceback
import warnings
import weakref
from typing import Any

from resctl import console
from resctl.launch import preload
from resctl.profile import contract


def is_forked_worker(env: Any = os.environ) -> bool:
    """Forked from the launcher (not exec'd): multiprocessing knows a parent process."""
    import multiprocessing

    return env.get(contract.PRELOAD) == "1" and multiprocessing.parent_process() is not None


def reset() -> list[str]:
    """Everything above, in a forked worker; returns what was reset (for tests)."""
    done = []
    for name, step in (("atexit", _atexit), ("logging", _logging), ("warnings", _warnings), ("hooks", _hooks),
                       ("signals", _signals), ("random", _random), ("stdin", _stdin),
                       ("multiprocessing", _multiprocessing), ("environment", _environment)):
        try:
            step()
        except Exception as err:  # noqa: BLE001 - say what differs, and run the script anyway
            console.line(f"resctl: this forked worker keeps the launcher's {name} state ({type(err).__name__}: {err}); "
                         "launch.worker_start = \"exec\" starts a new interpreter")
            continue
        done.append(name)
    return done


def _atexit() -> None:
    atexit._clear()
    for func, args, kwargs in preload.ExitHandlers.at_import():
        atexit.register(func, *args, **kwargs)
    registry = getattr(weakref.finalize, "_registry", {})
    for info in list(registry.values()):
        info.atexit = False  # the launcher's objects: not finalized by a worker's exit


def _logging() -> None:
    import logging

    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)  # not closed: their files are the launcher's
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    logging.setLogRecordFactory(logging.LogRecord)
    logging.captureWarnings(False)
    with logging._lock:  # type: ignore[attr-defined]
        del logging._handlerList[:]  # type: ignore[attr-defined]  # logging.shutdown must not flush the launcher's


def _warnings() -> None:
    warnings.showwarning = getattr(warnings, "_showwarning_orig", warnings.showwarning)
    warnings.onceregistry.clear()  # type: ignore[attr-defined]
    warnings._filters_mutated()  # type: ignore[attr-defined]  # every module's __warningregistry__ is stale now
    preload.ImportWarnings.replay()  # what importing torch warned in the launcher, as a new interpreter shows it


def _hooks() -> None:
    sys.excepthook = sys.__excepthook__
    sys.unraisablehook = sys.__unraisablehook__
    threading.excepthook = threading.__excepthook__
    fresh_faulthandler()


def fresh_faulthandler() -> None:
    """The fault handler as a new interpreter has it: off unless PYTHONFAULTHANDLER or -X faulthandler
    (torch elastic's error handler turns it on in the launcher; imports of the shim may too)."""
    wanted = bool(os.environ.get("PYTHONFAULTHANDLER")) or "faulthandler" in getattr(sys, "_xoptions", {})
    if faulthandler.is_enabled() and not wanted:
        faulthandler.disable()


def _multiprocessing() -> None:
    """The worker is the main process of its own multiprocessing world, not the launcher's child:
    `current_process()` is MainProcess, no parent, no children, no start method chosen yet."""
    import multiprocessing.context
    import multiprocessing.process as mp_process

    mp_process._current_process = _MainProcess()  # type: ignore[attr-defined]
    mp_process._parent_process = None  # type: ignore[attr-defined]
    mp_process._children = set()  # type: ignore[attr-defined]
    mp_process._process_counter = itertools.count(1)  # type: ignore[attr-defined]
    multiprocessing.context._default_context._actual_context = None  # type: ignore[attr-defined]


def _signals() -> None:
    signal.set_wakeup_fd(-1)
    for signum in signal.valid_signals():
        if signum in (signal.SIGKILL, signal.SIGSTOP):
            continue
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if signum == signal.SIGINT:
            signal.signal(signum, signal.default_int_handler)
        elif callable(handler):
            signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _random() -> None:
    random.seed()
    numpy_random = sys.modules.get("numpy.random")  # not imported yet: it seeds itself when it is (and
    if numpy_random is not None:                     # touching `numpy.random` would import it: 80 ms)
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # a new process seeds it from the OS too


def _stdin() -> None:
    stream = sys.stdin
    try:
        replaced = stream is not None and stream.fileno() != 0
    except (OSError, ValueError):
        replaced = True
    if not replaced:
        return
    try:
        os.fstat(0)
    except OSError:
        return  # the launcher had no stdin either
    old = sys.__stdin__
    sys.stdin = sys.__stdin__ = open(  # type: ignore[misc]
        0, closefd=False, encoding=getattr(old, "encoding", None) or "utf-8",
        errors=getattr(old, "errors", None) or "strict", newline="\n" if os.name != "nt" else None)
    if stream is not None:
        try:
            fd = stream.fileno()
            stream.close()
            os.close(fd)  # multiprocessing's /dev/null, opened with closefd=False
        except (OSError, ValueError):
            pass


def post_error(err: BaseException) -> bool:
    """Give the launcher a failed worker's traceback, as torch's spawn wrapper would have: it names
    the cause in the launcher's log and the console's restart line. The error file is the wrapper's
    (a local of `torch.multiprocessing.spawn._wrap`, further up this stack); False when not found."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_wrap" and code.co_filename.endswith(os.path.join("multiprocessing", "spawn.py")):
            path = frame.f_locals.get("error_file")
            if not isinstance(path, str):
                return False
            text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
            try:
                with open(path, "wb") as fh:
                    pickle.dump(text, fh)
            except OSError:
                return False
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _main_process_class() -> type:
    import multiprocessing.process as mp_process

    class _MainProcess(mp_process.BaseProcess):
        """multiprocessing's own `_MainProcess` (deleted from its module once made): what
        `current_process()` is in a new interpreter."""

        def __init__(self) -> None:
            self._identity = ()
            self._name = "MainProcess"
            self._parent_pid = None
            self._popen = None
            self._closed = False
            key = mp_process.AuthenticationString(os.urandom(32))  # type: ignore[attr-defined]
            self._config = {"authkey": key, "semprefix": "/mp"}

        def close(self) -> None:
            pass

    return _MainProcess


def _MainProcess() -> Any:
    return _main_process_class()()


def _environment() -> None:
    """Variables the plan set for the launcher alone (PYTHONUNBUFFERED: its streams, which the
    workers inherit, are unbuffered as `python -u` makes torchrun's; the variable itself is not in
    a torchrun worker's environment)."""
    for name in os.environ.pop(contract.ADDED_ENV, "").split(","):
        if name:
            os.environ.pop(name, None)
