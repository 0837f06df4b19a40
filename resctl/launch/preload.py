"""What the launcher imports so that forked workers do not: `PRELOAD` before the first workers,
`LATE_PRELOAD` in a thread beside them (`LatePreload`, driven by the adapters' worker start and
monitor loop). Used by `resctl.launch.ft_entry` (with `RESCTL_PRELOAD=1`: forked workers)."""

from __future__ import annotations

import atexit
import gc
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
# FSDP 0.5 s) is imported in a thread beside the workers, when `launch.late_preload` says
# (`LatePreload`): a job's start never waits for it, nor its end, and workers restarted after it are
# forked with it loaded (in-job recovery in well under a second, bench/bench_recovery.py).
PRELOAD = ("torch", "torch.distributed", "torch.optim", "torch.nn", "resctl.shim.runtime", "resctl.checkpoint.engine",
           "nvidia_resiliency_ext.fault_tolerance.rank_monitor_client")
LATE_PRELOAD = ("torch._dynamo", "torch.distributed.fsdp")
LATE_AFTER = 3.0  # late, after-restart: seconds a cycle's workers run before LATE_PRELOAD is imported beside them
#: While the first workers may still send their note, the launcher looks for it this often (seconds), not only
#: once a monitor interval (5 s by default): the import then starts soon after the first step, and is over
#: before a restart that comes a few seconds into training (which would wait for the rest of it).
LATE_LOOK = 0.5
LATE_LOOK_FOR = 120.0  # seconds after the first workers started; past them, once a monitor interval


#: launch.late_preload = "auto" imports at once where the node has this many cores beyond one per local worker.
SPARE_CORES = 2


def usable_cores(root: Path = Path("/")) -> int:
    """The CPUs this process may run on: its affinity, bounded by a cgroup v2 CPU limit (`cpu.max`: a
    Kubernetes pod's CPU limit, which the affinity does not show)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = (root / "sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def choose_mode(setting: str, cores: int, workers: int) -> str:
    """`launch.late_preload` resolved for a node with `cores` usable CPUs and `workers` local workers."""
    if setting != "auto":  # already one of the schema's values (`contract.late_preload` gives "auto" for any other)
        return setting
    return "at-once" if cores - workers >= SPARE_CORES else "late"


class LatePreload:
    """`LATE_PRELOAD`, imported in a thread beside running workers, when `launch.late_preload` says
    (`choose_mode`): **at-once** with the first workers (where a core is spare: a kill in the job's first
    seconds then restarts as fast as a later one, issue 43); **late**: `LATE_AFTER` seconds into a cycle
    whose worker said its script imported them (its first optimizer step; where no core is spare, the import
    then does not compete with the workers' start); **after-restart**: the same, from a restarted cycle on
    (a job that never fails never pays for it).

    Every fork of the launcher (workers, rank monitors) happens in `_start_workers`, which first waits
    for a thread still importing (a child forked while another thread is inside an import inherits that
    module half-executed and its lock held: a deadlock or a broken module at the child's first use).
    A restart that comes before the thread started imports nothing first: its workers import what they
    use themselves, and the clock starts again with them.

    At the job's end the launcher abandons the import (`abandon`): the thread's next import raises, so
    the end's pure-Python process scan does not share the GIL with it (a short job's end waited 2-4 s for
    the import on an H200 when it was started at once before, docs/BENCHMARKS.md issue 31). Abandoning is
    for the end only: a fork after it would inherit modules the thread left half-imported."""

    thread: Any = None
    started_at: float | None = None
    mode: str | None = None
    cycles = 0
    abandoned = False

    @classmethod
    def enabled(cls) -> bool:
        return os.environ.get(contract.PRELOAD) == "1"

    @classmethod
    def workers_started(cls, workers: int = 1) -> None:
        if cls.mode is None and cls.enabled():
            setting = contract.late_preload(contract.read_plan(p) if (p := contract.Handed.of().plan) else None)
            cls.mode = choose_mode(setting, usable_cores(), workers)
        cls.cycles += 1
        if cls.started_at is None:
            cls.started_at = time.monotonic()
        if cls.mode == "at-once":
            cls.start_now()

    @classmethod
    def maybe_start(cls) -> None:
        """From the monitor loop (late, after-restart): start the thread once a cycle's workers have run long
        enough and one of them imported the late modules."""
        if cls.thread is None and cls.started_at is not None and cls._may_start() \
                and time.monotonic() - cls.started_at >= LATE_AFTER and cls.wanted():
            cls.start_now()

    @classmethod
    def _may_start(cls) -> bool:
        return cls.mode != "after-restart" or cls.cycles > 1

    @classmethod
    def look_within(cls, seconds: float) -> float:
        """How long the launcher's monitor may sleep: at most LATE_LOOK while the thread waits for a worker's
        note, in the first LATE_LOOK_FOR seconds of the workers (a GPU job's first step comes seconds after
        its start: with a 5 s look the import overlapped the first seconds of training, and a kill -9 there
        waited for it, ~2 s on one H200)."""
        since = cls.started_at
        if cls.thread is None and since is not None and time.monotonic() - since < LATE_LOOK_FOR and cls.enabled() \
                and cls._may_start():
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
        """Import LATE_PRELOAD in the thread now (at once, or a spare node waiting: its first workers come later)."""
        if cls.thread is None and cls.enabled() and not cls.abandoned:
            import logging

            logging.getLogger(__name__).info("late preload: importing %s for restarted workers", ", ".join(LATE_PRELOAD))
            cls.thread = threading.Thread(target=_import, args=(LATE_PRELOAD, _Abandoned()), name="resctl-preload",
                                          daemon=True)
            cls.thread.start()

    @classmethod
    def before_fork(cls) -> None:
        if cls.thread is not None:
            cls.thread.join()
        else:  # a restart came first: no import now; the clock starts again with the new workers
            cls.started_at = None

    @classmethod
    def abandon(cls, wait: float = 1.0) -> None:
        """At the job's end: the thread's next import raises and it stops (waited for up to `wait` seconds,
        the GIL then its own), so the launcher's end runs alone."""
        cls.abandoned = True
        thread = cls.thread
        if thread is not None and thread.is_alive():
            import logging

            logging.getLogger(__name__).info("late preload: abandoned at the job's end")
            thread.join(wait)


class _Abandoned:
    """A `sys.meta_path` finder (the import system's own extension point) for the preload thread's
    imports: once `LatePreload.abandon` was called, each new module the thread imports raises."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if LatePreload.abandoned and threading.current_thread() is LatePreload.thread:
            raise ImportError(f"{name}: the launcher's late preload was abandoned at the job's end")
        return None


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


@contextmanager
def collector_off(freeze: bool) -> Iterator[None]:
    """Python's cyclic collector off while a batch of imports runs, and back as it was after. Importing torch,
    NVRx and the shim ran 5 full collections over their ~180,000 objects, which are never garbage (one collection
    after them frees ~7,000): 0.3 CPU-s of a launcher's 2.7 on the dev VM (docs/BENCHMARKS.md, "The collector
    off while importing"). `freeze`: what was imported goes to the permanent generation (`gc.freeze`), so that
    no later collection walks it, and the ~7,000 objects of cycles the imports left stay (well under a MB)
    instead of a full collection (0.16 CPU-s)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if was:
            gc.enable()


def import_torch() -> None:
    """Import torch first, recording what it warns (`ImportWarnings`)."""
    with ImportWarnings.recording():
        import torch  # noqa: F401  # deferred: only launchers that fork workers import it, inside the recording


def _import(names: tuple[str, ...], finder: _Abandoned | None = None) -> None:
    if finder is not None:
        sys.meta_path.insert(0, finder)  # type: ignore[arg-type]
    try:
        with ExitHandlers.recording(), collector_off(freeze=True):
            for name in names:
                if LatePreload.abandoned:
                    break
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - a worker that needs it imports it (and reports) itself
                    continue
    finally:
        if finder is not None and finder in sys.meta_path:
            sys.meta_path.remove(finder)  # type: ignore[arg-type]


def preload() -> None:
    with ExitHandlers.recording():
        for name in PRELOAD:
            importlib.import_module(name)
