"""How a worker ends: as `python script.py` would, in a forked worker as in an exec'd one.

An interpreter that runs a script ends in a fixed order (CPython's `Py_RunMain`): an uncaught
exception goes to `sys.excepthook` (the traceback on stderr, from the script's own frame); a
`SystemExit` becomes the exit status (None -> 0, an int -> itself, anything else is printed to
stderr and gives 1); then non-daemon threads are joined, `atexit` handlers run, the standard
streams are flushed, the script's module is torn down (its objects' `__del__` run, a file it never
closed is flushed), and an uncaught `KeyboardInterrupt` ends the process by SIGINT (status -2, what
a shell shows as 130).

A worker forked from the launcher runs inside torch's multiprocessing wrapper, which does none of
that: it skips `atexit`, reports an exception through a queue to the launcher's log instead of the
console, and a worker that ends by `sys.exit()`, `os._exit(0)` or a KeyboardInterrupt never posts
the result the launcher waits for (`resctl.launch.adapters` now takes "exited with 0" for done).
`run` and `leave` below give both start modes the interpreter's ending.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import signal
import sys
import threading
import types
import weakref
from dataclasses import dataclass
from types import TracebackType
from typing import Callable

from resctl import console
from resctl.errors import EXIT_USAGE, ResctlError

_SHIM_DIR = os.path.dirname(os.path.abspath(__file__))
# Frames a traceback of `python script.py` does not have: the shim's, runpy's, and NVRx's
# in-process wrapper around the script.
_INPROCESS = os.sep + os.path.join("nvidia_resiliency_ext", "inprocess", "")


def _not_the_scripts(filename: str) -> bool:
    return (filename.startswith(_SHIM_DIR + os.sep) or filename == "<frozen runpy>"
            or filename.endswith(os.sep + "runpy.py") or _INPROCESS in filename)


@dataclass(frozen=True)
class Ending:
    """How the script ended: the exit status, and whether the process must die of SIGINT
    (an uncaught KeyboardInterrupt) instead of exiting."""

    code: int
    error: BaseException | None = None
    by_sigint: bool = False

    @property
    def clean(self) -> bool:
        return self.code == 0 and not self.by_sigint


def exit_status(code: object) -> int:
    """The status `sys.exit(code)` gives, printing a non-int code to stderr as the interpreter does."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF  # what the C exit() keeps of it (-1 -> 255, 256 -> 0)
    try:
        print(code, file=sys.stderr, flush=True)
    except Exception:  # noqa: BLE001 - an unprintable code still exits 1
        pass
    return 1


def script_traceback(tb: TracebackType | None) -> TracebackType | None:
    """`tb` without the leading frames of the shim and runpy (the traceback starts at the script,
    as under `python script.py`); all of it when the error is in the shim itself."""
    first = tb
    while first is not None and _not_the_scripts(first.tb_frame.f_code.co_filename):
        first = first.tb_next
    return first if first is not None else tb


def _shown_traceback(err: BaseException) -> TracebackType | None:
    tb = script_traceback(err.__traceback__)
    if isinstance(err, SyntaxError) and tb is err.__traceback__:
        return None  # the script did not compile: Python shows the line and the caret, no frames
    return tb


def _is_refusal(err: BaseException) -> bool:
    """resctl's own refusal of bad input (a checkpoint that does not fit the state, a directory
    another job owns: `exit_code` 2). Its message says what and how to fix; a traceback would
    only bury it."""
    return isinstance(err, ResctlError) and getattr(err, "exit_code", None) == EXIT_USAGE


def report_uncaught(err: BaseException) -> None:
    """What the interpreter does with an uncaught exception: `sys.excepthook` (the script's own, if it
    set one, or torch's `[rankN]:` prefixer), which prints the traceback to stderr. A refusal of
    resctl's own goes to the same hook without its frames: the hook prints `Type: message`, no stack."""
    tb = None if _is_refusal(err) else _shown_traceback(err)
    err.__traceback__ = tb  # the default hook prints the exception's own traceback, not its argument
    try:
        sys.excepthook(type(err), err, tb)
    except BaseException as hook_error:  # noqa: BLE001 - as Python: report both, carry on ending
        print("Error in sys.excepthook:", file=sys.stderr)
        sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
        print("\nOriginal exception was:", file=sys.stderr)
        sys.__excepthook__(type(err), err, tb)
    _flush()


#: Set once the script has ended (returned or raised): the worker is on its way out, printing its exit
#: message or traceback, joining threads, running atexit. A restart stop then lets it finish
#: (`resctl.shim.runtime.Shim.on_restart_stop`), as torchrun's slower stop does.
over = threading.Event()


def run(body: Callable[[], None]) -> Ending:
    """Run the script (`body`) and return how it ended; an uncaught exception is reported first."""
    try:
        body()
    except SystemExit as exit_:
        over.set()
        return Ending(exit_status(exit_.code), exit_ if exit_.code not in (None, 0) else None)
    except BaseException as err:  # noqa: BLE001 - every ending is the interpreter's
        over.set()
        report_uncaught(err)
        return Ending(1, err, by_sigint=isinstance(err, KeyboardInterrupt))
    over.set()
    return Ending(0)


def finalize() -> None:
    """The interpreter's shutdown, less the teardown of modules: join non-daemon threads, run the
    atexit handlers, flush the standard streams. Safe to call twice."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # what Py_Finalize calls first
    except Exception:  # noqa: BLE001
        pass
    atexit._run_exitfuncs()
    _flush()


SETTLE_SWITCH_S = 0.1


def teardown_main(ending: Ending) -> None:
    """What `Py_Finalize` does to the script's module, for a forked worker that leaves by `os._exit`.
    The module leaves `sys.modules` and the garbage is collected, so its objects' `__del__` run (with
    the script's names still there) and a file the script never closed is flushed and closed; a module
    something still holds (a thread running the script's code) is then cleared as CPython clears one.
    Other threads wait meanwhile, as at the interpreter's end."""
    main = sys.modules.pop("__main__", None)
    if main is None:
        return
    held = weakref.ref(main)
    for attr in ("last_type", "last_value", "last_traceback"):
        setattr(sys, attr, None)
    _drop_tracebacks(ending.error)  # a traceback's frames hold the script's names
    interval = sys.getswitchinterval()
    # Other threads rarely run meanwhile, yet a CPU-bound one that takes the GIL while a flush waits on the
    # disk gives it back within SETTLE_SWITCH_S (a switch interval of hours would let it keep it: no exit).
    sys.setswitchinterval(SETTLE_SWITCH_S)
    try:
        _flush_files_in(vars(main))
        del main
        gc.collect()
        if (alive := held()) is not None:
            _clear_module(vars(alive))
            del alive
            gc.collect()
    finally:
        sys.setswitchinterval(interval)


#: What the walk from the script's names does not enter: other modules' names, classes, code.
_OPAQUE = (types.ModuleType, type, types.FunctionType, types.CodeType, types.FrameType, types.BuiltinFunctionType)


def _flush_files_in(names: dict[str, object], depth: int = 5, most: int = 100_000) -> None:
    """Flush the files the script's objects hold (a few levels down): a collection closes the
    garbage's files in no set order, and a text file closed after its buffer loses what it held
    (CPython's own shutdown frees the script's module otherwise and keeps it)."""
    seen: set[int] = {id(names)}
    frontier: list[object] = [names]
    files: list[io.IOBase] = []
    for _ in range(depth):
        found: list[object] = []
        for ref in (r for obj in frontier for r in gc.get_referents(obj)):
            if id(ref) in seen or isinstance(ref, _OPAQUE) or len(seen) >= most:
                continue
            seen.add(id(ref))
            (files if isinstance(ref, io.IOBase) else found).append(ref)
        frontier = found
    for f in files:
        try:
            if not f.closed and f.writable():
                f.flush()
        except Exception:  # noqa: BLE001 - OSError, ValueError, a remote file's client error: the script's own
            pass


def _drop_tracebacks(err: BaseException | None) -> None:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        err.__traceback__ = None
        err = err.__cause__ or err.__context__


def _clear_module(names: dict[str, object]) -> None:
    """CPython's `_PyModule_ClearDict`: names with one leading underscore to None, then all but `__builtins__`."""
    for underscore in (True, False):
        for name in [n for n in names if n != "__builtins__" and (n[:1] == "_" and n[:2] != "__") == underscore]:
            names[name] = None


def leave(ending: Ending, *, forked: bool) -> int:
    """End the worker as the interpreter would end after `ending`. An exec'd worker returns its
    status for `sys.exit` (the interpreter does the rest, as for any script); a forked one leaves
    here, with no result posted to torch's wrapper: posting one makes the worker wait until the
    launcher has read every worker's, which a launcher that is stopping the job never does (the
    launcher takes an exit with 0 for done, `resctl.launch.adapters`)."""
    if ending.by_sigint:
        finalize()
        _teardown(ending)  # CPython too tears down before it kills itself by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
        os.kill(os.getpid(), signal.SIGINT)
    if not forked:
        return ending.code
    finalize()
    _teardown(ending)
    _flush()
    os._exit(ending.code)


def _teardown(ending: Ending) -> None:
    """`teardown_main`, whose failure (an object of the script's that raises when looked at) is told and
    never keeps a forked worker from its exit with the script's status."""
    try:
        teardown_main(ending)
    except BaseException as err:  # noqa: BLE001
        console.line(f"resctl: tearing down the script's module failed ({type(err).__name__}: {err}); exiting with "
                     f"the script's status {ending.code}")


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
