"""Each rank's own work in a step of a synchronous (DDP) job: the time the other ranks wait for.

In DDP every rank waits for the slowest in the gradient all-reduce, so step times are equal and a slow rank
does not stand out in them (resctl/health/stragglers.py). What differs is the work before the wait: from
the step boundary (the optimizer step) to the moment this rank's last gradient bucket is ready for its
all-reduce. DDP calls its communication hook at exactly that moment for each bucket, so the shim times it
there: every `DistributedDataParallel` gets a hook that notes the time and then does what DDP would have
done (`allreduce_hook`, DDP's own reference for its default), or the script's own hook when it registers
one (it is wrapped, not replaced). On CUDA the times are CUDA events on the stream that produced the
gradients, read without blocking at a later boundary: the GPU's own work, not the host's launch times.

`busy` then goes into the step event (`busy`, seconds); the straggler detector compares ranks by it when
they all have it. A DDP module is noted at its first forward (a global forward pre-hook, removed at the
first optimizer step: no cost per module call after it), and timed from the step boundary where the last
`WINDOW` steps after a `WARMUP` took `TIMED_FROM_S` or more (median): a Python hook per bucket in place of DDP's C++
all-reduce costs tens of microseconds a step, which is several percent of a tiny CUDA step (issue 31) and
under 0.5 % from `TIMED_FROM_S` up. A rank slow enough to matter makes every rank's step that long, so it
is timed and named all the same. A script's own hook is wrapped when it registers it (it already pays for a
Python hook). Not timed: FSDP (its own reduce-scatter, no DDP hook), a DDP module with a built-in C++ hook
(`_register_builtin_comm_hook`), steps under `no_sync()` only (their grads are not reduced: the step that
reduces them holds their work too).
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections import deque
from typing import Any, Callable

from resctl.patching import Patches

#: The median step (seconds) from which DDP's buckets are timed, over the last `WINDOW` steps after the
#: first `WARMUP` (a process's first steps are long for reasons of their own: allocation, autotuning, peers).
TIMED_FROM_S = 0.01
WINDOW = 8
WARMUP = 8


class BusyClock:
    """The step boundary and the last bucket ready since it (host clock, or CUDA events on a GPU)."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.ready: float | None = None
        self._cuda_start: Any = None
        self._cuda_ready: Any = None
        self._cuda_device: Any = None  # the device of the gradients: the start is recorded on its stream
        self._broken = False  # CUDA timing failed once (reported as no busy time from then on, never raised)
        self._pending: deque[tuple[Any, Any]] = deque(maxlen=8)  # CUDA (start, ready) not yet complete
        self._steps: deque[float] = deque(maxlen=WINDOW)  # the last steps' lengths, while modules wait
        self._warmup = WARMUP
        #: DDP modules seen at a first forward, not timed yet, and what times one (`install`'s).
        self.waiting: list[weakref.ref[Any]] = []
        self.time_module: Callable[[Any], None] = lambda module: None

    def bucket_ready(self, tensor: Any) -> None:
        """From DDP's hook, as each bucket is ready (the last one of a step wins)."""
        if getattr(tensor, "is_cuda", False):
            if self._broken:
                return
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(tensor.device))
            self._cuda_ready, self._cuda_device = event, tensor.device
            if self._cuda_start is None:  # the first timed step: its start is this step's first bucket
                self._cuda_start = event
        else:
            self.ready = time.monotonic()

    def boundary(self, now: float) -> float | None:
        """At the optimizer step: this rank's own work in the step that ended (None: none timed)."""
        busy = None if self.ready is None else max(0.0, self.ready - self.start)
        if self.waiting:
            self._time_when_long(now - self.start)
        self.start, self.ready = now, None
        if (self._cuda_ready is not None or self._pending) and not self._broken:
            try:
                busy = self._cuda_boundary()
            except Exception:  # noqa: BLE001 - telemetry never fails the user's optimizer step
                self._broken, self._cuda_start, self._cuda_ready = True, None, None
                self._pending.clear()
                busy = None
        return busy

    def _time_when_long(self, step: float) -> None:
        if self._warmup > 0:
            self._warmup -= 1
            return
        self._steps.append(step)
        if len(self._steps) == WINDOW and statistics.median(self._steps) >= TIMED_FROM_S:
            modules, self.waiting = [ref() for ref in self.waiting], []
            for module in modules:
                if module is not None:
                    self.time_module(module)

    def _cuda_boundary(self) -> float | None:
        import torch

        if self._cuda_ready is not None and self._cuda_start is not None:
            self._pending.append((self._cuda_start, self._cuda_ready))
        start = torch.cuda.Event(enable_timing=True)
        # On the gradients' device, not the thread's current one: a script that moves its model to
        # cuda:LOCAL_RANK without `torch.cuda.set_device` stays on cuda:0, and events of two devices cannot be
        # compared.
        start.record(torch.cuda.current_stream(self._cuda_device))
        self._cuda_start, self._cuda_ready = start, None
        busy = None
        while self._pending and self._pending[0][0].query() and self._pending[0][1].query():  # read without blocking
            begin, end = self._pending.popleft()
            busy = begin.elapsed_time(end) / 1000.0
        return busy


class _Slot:
    """The hook DDP calls: note the time, then the script's hook or DDP's reference all-reduce."""

    def __init__(self, clock: BusyClock, hook: Callable[..., Any], state: Any) -> None:
        self.clock, self.hook, self.state = clock, hook, state


def _timed(slot: _Slot, bucket: Any) -> Any:
    slot.clock.bucket_ready(bucket.buffer())
    return slot.hook(slot.state, bucket)


# DDP refuses a hook whose `bucket` or return annotations are not its types (here strings: postponed
# annotations), and accepts none at all.
del _timed.__annotations__["bucket"], _timed.__annotations__["return"]


def install(clock: BusyClock, patches: Patches) -> Callable[[], None]:
    """Note every DDP module at its first forward, for `clock` to time once steps are long; returns what
    the first optimizer step calls (removes the pre-hook)."""
    try:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:  # torch without distributed
        return lambda: None
    register = DDP.register_comm_hook

    def register_timed(self: Any, state: Any, hook: Callable[..., Any]) -> None:
        slot = getattr(self, "_resctl_busy_slot", None)
        if slot is not None:  # ours is in place: the script's hook runs inside it
            self._check_comm_hook(hook)
            slot.hook, slot.state = hook, state
            return
        self._resctl_busy_slot = _Slot(clock, hook, state)
        register(self, self._resctl_busy_slot, _timed)

    def time_module(module: Any) -> None:
        if getattr(module, "_resctl_busy_slot", None) is None:  # the script registered no hook of its own
            try:
                register_timed(module, module.process_group, allreduce_hook)
            except Exception:  # noqa: BLE001 - a built-in (C++) hook already (RuntimeError), or a DDP without a
                pass  # logger (AssertionError: every parameter in delay_all_reduce_named_params): not timed

    def attach(module: Any, _args: Any) -> None:
        if not isinstance(module, DDP) or getattr(module, "_resctl_busy_seen", False):
            return
        setattr(module, "_resctl_busy_seen", True)  # noqa: B010 - a Module's __setattr__ is typed for tensors
        if getattr(module, "_resctl_busy_slot", None) is None:
            clock.waiting.append(weakref.ref(module))

    clock.time_module = time_module
    patches.set(DDP, "register_comm_hook", register_timed)
    handle = register_module_forward_pre_hook(attach)
    patches.on_undo(handle.remove)
    return handle.remove
