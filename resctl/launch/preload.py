"""What the launcher imports so that forked workers do not: `PRELOAD` before the first workers,
`LATE_PRELOAD` in a thread beside them (`LatePreload`, driven by the adapters' worker start and
monitor loop). Used by `resctl.launch.ft_entry` (with `RESCTL_PRELOAD=1`: forked workers)."""

from __future__ import annotations

import atexit
import importlib
import os
import sys
import threading
import time
import warnings
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from resctl.launch import stop
from resctl.patching import Patches
from resctl.profile import contract

# Imported once in the launcher when workers are forked from it, so no worker pays for them again:
# what every worker imports (torch, the shim), before the first workers start. What a script may
# import later (torch imports torch._dynamo and sympy on the first optimizer it builds: about 1 s;
# FSDP 0.5 s) is imported in a thread once the first workers have run `LATE_AFTER` seconds and one of them
# said its script imported them (its first optimizer step, `resctl.launch.stop.mark_late_imports`: a script
# that never builds an optimizer leaves the launcher without them, ~1.3 CPU-s and their memory): a
# job's start never waits for them, nor a short job's end (the happy path is torchrun's,
# bench/bench_happy_path.py), nor a restart that comes sooner, and workers restarted later are
# forked with them loaded (in-job recovery in well under a second, bench/bench_recovery.py).
PRELOAD = ("torch", "torch.distributed", "torch.optim", "torch.nn", "resctl.shim.runtime", "resctl.checkpoint.engine",
           "nvidia_resiliency_ext.fault_tolerance.rank_monitor_client")
LATE_PRELOAD = ("torch._dynamo", "torch.distributed.fsdp")
LATE_AFTER = 3.0  # seconds the first workers run before LATE_PRELOAD is imported beside them
#: While the first workers may still send their note, the launcher looks for it this often (seconds), not only
#: once a monitor interval (5 s by default): the import then starts soon after the first step, and is over
#: before a restart that comes a few seconds into training (which would wait for the rest of it).
LATE_LOOK = 0.5
LATE_LOOK_FOR = 120.0  # seconds after the first workers started; past them, once a monitor interval


class LatePreload:
    """`LATE_PRELOAD`, imported in a thread beside running workers. Every fork of the launcher
    (workers, rank monitors) happens in `_start_workers`, which first waits for a thread still
    importing (a child forked while another thread is inside an import inherits that module
    half-executed and its lock held: a deadlock or a broken module at the child's first use).

    A restart that comes before the thread started imports nothing first (issue 31: it used to
    import them synchronously, 3.4 s of a 4.95 s recovery on one H200): its workers import what
    they use themselves, as the first ones did, and the clock starts again with them. A restart
    while the thread imports still waits for the rest of it (at most the import's time, once).
    *Not done:* starting the thread with the first workers (where a core is spare) made a short
    job's end wait for it (re-measured on the H200 in session 9: +2 s with compiled bytecode, +4-5 s
    without; the end's pure-Python process scan shares the GIL with the import: docs/BENCHMARKS.md,
    issue 31); forking mid-import by abandoning the thread at a module boundary needs the modules it
    executed forgotten, and executing them again registers torch libraries twice ("Only a single TORCH_LIBRARY can be used to register the
    namespace ..."), seen."""

    thread: Any = None
    started_at: float | None = None

    @classmethod
    def enabled(cls) -> bool:
        return os.environ.get(contract.PRELOAD) == "1"

    @classmethod
    def workers_started(cls) -> None:
        if cls.started_at is None:
            cls.started_at = time.monotonic()

    @classmethod
    def maybe_start(cls) -> None:
        """From the monitor loop: start the thread once the first workers have run long enough and one
        of them imported the late modules."""
        if cls.thread is None and cls.started_at is not None and time.monotonic() - cls.started_at >= LATE_AFTER \
                and cls.wanted():
            cls.start_now()

    @classmethod
    def look_within(cls, seconds: float) -> float:
        """How long the launcher's monitor may sleep: at most LATE_LOOK while the thread waits for a worker's
        note, in the first LATE_LOOK_FOR seconds of the workers (a GPU job's first step comes seconds after
        its start: with a 5 s look the import overlapped the first seconds of training, and a kill -9 there
        waited for it, ~2 s on one H200)."""
        since = cls.started_at
        if cls.thread is None and since is not None and time.monotonic() - since < LATE_LOOK_FOR and cls.enabled():
            return min(seconds, LATE_LOOK)
        return seconds

    @staticmethod
    def wanted() -> bool:
        """A worker of this launcher said its script imported LATE_PRELOAD (`resctl.launch.stop`'s note)."""
        marker = os.environ.get(stop.ENV)
        return marker is not None and stop.late_imports_marked(Path(marker))

    @staticmethod
    def note_imported() -> None:
        """In a forked worker at its first optimizer step: say so when its script imported any of LATE_PRELOAD
        (torch imports torch._dynamo, and with it FSDP, when the first optimizer is built)."""
        if any(name in sys.modules for name in LATE_PRELOAD):
            stop.mark_late_imports(os.environ)

    @classmethod
    def start_now(cls) -> None:
        """Import LATE_PRELOAD in the thread now (a spare node waiting: its first workers come later)."""
        if cls.thread is None and cls.enabled():
            import logging

            logging.getLogger(__name__).info("late preload: importing %s for restarted workers", ", ".join(LATE_PRELOAD))
            cls.thread = threading.Thread(target=_import, args=(LATE_PRELOAD,), name="resctl-preload", daemon=True)
            cls.thread.start()

    @classmethod
    def before_fork(cls) -> None:
        if cls.thread is not None:
            cls.thread.join()
        else:  # a restart came first: no import now; the clock starts again with the new workers
            cls.started_at = None


ExitHandler = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class ExitHandlers:
    """The atexit handlers that modules register when the launcher imports them for the workers
    (logging's flush, torch's DataLoader exit flag, ...). A forked worker drops the launcher's exit
    handlers and registers these again (`resctl.shim.forked`): a new interpreter importing the same
    modules would have them, and nothing of the launcher's."""

    recorded: list[ExitHandler] = []

    @classmethod
    @contextmanager
    def recording(cls) -> Iterator[None]:
        """Record what this thread registers meanwhile (another thread's registrations are not imports)."""
        real, me = atexit.register, threading.get_ident()

        def register(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == me:
                cls.recorded.append((func, args, kwargs))
            return real(func, *args, **kwargs)

        patches = Patches("preload.recording")
        patches.set(atexit, "register", register)
        try:
            yield
        finally:
            patches.undo()

    @classmethod
    def at_import(cls) -> list[ExitHandler]:
        """What a new interpreter would have registered, in order: the standard library's handlers of
        modules loaded before the recording started, then the recorded ones."""
        found: list[ExitHandler] = []
        logging, mp_util = sys.modules.get("logging"), sys.modules.get("multiprocessing.util")
        for func in (getattr(logging, "shutdown", None), getattr(mp_util, "_exit_function", None)):
            if func is not None and all(func is not f for f, _, _ in cls.recorded):
                found.append((func, (), {}))
        found.extend(cls.recorded)
        exitfunc = weakref.finalize._exitfunc  # type: ignore[attr-defined]
        if getattr(weakref.finalize, "_registered_with_atexit", False) and all(
                getattr(f, "__func__", f) is not getattr(exitfunc, "__func__", exitfunc) for f, _, _ in found):
            found.append((exitfunc, (), {}))  # a worker's finalizers would not register it again
        return found


class ImportWarnings:
    """The warnings that importing `PRELOAD` raised (torch's pynvml FutureWarning, ...): a new
    interpreter importing the same modules would show them, so a forked worker shows them again
    (`resctl.shim.forked`), through its own filters, as torchrun's workers do."""

    recorded: list[warnings.WarningMessage] = []

    @classmethod
    @contextmanager
    def recording(cls) -> Iterator[None]:
        with warnings.catch_warnings(record=True) as caught:  # the main thread, before any worker
            warnings.simplefilter("always")  # every one: the worker's filters decide what shows
            yield
        cls.recorded.extend(caught)

    @classmethod
    def replay(cls) -> None:
        for w in cls.recorded:
            module = os.path.splitext(os.path.basename(w.filename))[0]
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, module=module, registry={})


def import_torch() -> None:
    """Import torch first, recording what it warns (`ImportWarnings`)."""
    with ImportWarnings.recording():
        import torch  # noqa: F401  # deferred: only launchers that fork workers import it, inside the recording


def _import(names: tuple[str, ...]) -> None:
    with ExitHandlers.recording():
        for name in names:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a worker that needs it imports it (and reports) itself
                continue


def preload() -> None:
    with ExitHandlers.recording():
        for name in PRELOAD:
            importlib.import_module(name)
