"""Each rank's own work in a step of a synchronous job (DDP, FSDP2, FSDP1): the time the other ranks wait for.

In a synchronous job every rank waits for the slowest in its collectives, so step times are equal and a slow
rank does not stand out in them (resctl/health/stragglers.py). What differs is the work outside the waits:
a rank's own work in a step is the step's wall time (optimizer step to optimizer step) minus the time the
rank was blocked in the step's collectives. The rank the others wait for is blocked least, and its own work
holds its delay wherever in the step it comes: before the forward (a slow data loader), between `backward()`
and `optimizer.step()` (clipping, metrics, logging on a slow host), inside the forward of one layer.

Why wall minus waits, not the time up to a collective: a step of FSDP holds dozens of collectives (an
all-gather per layer in the forward and again in the backward, a reduce-scatter per layer), a DDP step one
all-reduce per bucket, and work after the last one (the optimizer, the script's own). Timing the waits and
subtracting them needs no model of where a step's collectives are; the work between two of them, or after
the last, counts wherever it is. The waits are timed where the host waits:

- every `Work.wait()` called from Python on the training thread (the thread of the optimizer step) or in a
  backward it runs (on a GPU autograd runs the backward, FSDP's hooks included, in a thread per device; told
  by torch's graph task id, as FSDP2 tells its backward): the waits of FSDP2 (its all-gather copy-out and its
  reduce-scatter, sync or async), of FSDP1 and of every synchronous `torch.distributed` call (`all_reduce`
  waits in Python), the script's own metric reductions included. `Work.wait` is replaced through
  `resctl.patching.Patches`; waits of other threads (a background checkpoint writer's group) pass through
  untimed: they block no step.
- DDP's gradient all-reduce waits in C++ (the reducer), so DDP's comm hook is timed instead: every
  `DistributedDataParallel` gets a hook that does what DDP would have done (`allreduce_hook`, DDP's own
  reference for its default), or the script's own hook when it registers one (wrapped, not replaced), and
  for the step's last bucket (`GradBucket.is_last()`) chains a callback on its future: the time from the
  last bucket issued to its all-reduce done is the step's wait (the host has nothing left to do in the
  backward but wait for it).

On CUDA a collective blocks a stream, not the host: there each timed wait is a pair of CUDA events on the
current stream around `Work.wait()` (the stream's wait for the collective), DDP's wait a pair from the last
bucket issued to its future's callback, and the step's wall time two events at the boundaries; they are
read without blocking at a later boundary. FSDP2 runs its all-gathers on a stream of its own that the
compute stream waits on by event: there the pair times the all-gather stream's wait for NCCL, which overlaps
the compute of the layer before it, so every rank's own work is undercounted by the overlapped transfers
(alike on balanced ranks) and the rank the others wait for stands out by more, not less.

Not NVRx's straggler detector (`nvidia_resiliency_ext.straggler`): it times the sections a script marks
(and kernels through CUPTI), so it needs the script edited; this needs no edit and serves CPU jobs too.

`busy` then goes into the step event (`busy`, seconds); the straggler detector compares ranks by it when
they all have it. Timing starts at the step boundary where the last `WINDOW` steps after a `WARMUP` took
`TIMED_FROM_S` or more (their upper median), in a process whose default group is up: a Python hook per
bucket in place of DDP's C++ all-reduce costs tens of microseconds a step, and a wrapper per wait (0.4 us
on CPU, bench/bench_busy.py; a pair of CUDA events on a GPU) adds up over FSDP's dozens of waits: several
percent of a tiny CUDA step (issue 31), under 0.5 % from `TIMED_FROM_S` up. A rank slow enough to matter makes
every rank's step that long, so it is timed and named all the same. A DDP module is noted at its first
forward (a global forward pre-hook, removed at the first optimizer step: no cost per module call after it);
a script's own DDP hook is wrapped when it registers it (it already pays for a Python hook). Not timed:
waits in C++ other than DDP's (a built-in C++ DDP hook, `_register_builtin_comm_hook`; functional
collectives' `wait_tensor` under `torch.compile`): a step with only those reports its wall time as its own
work, alike on every rank (no name, and no false one).
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

from resctl.patching import Patches

#: The median step (seconds) from which waits and DDP's buckets are timed, over the last `WINDOW` steps after
#: the first `WARMUP` (a process's first steps are long for reasons of their own: allocation, autotuning, peers).
TIMED_FROM_S = 0.01
WINDOW = 8
WARMUP = 8
_monotonic = time.monotonic  # the host clock (a name of this module: the unit tests give it their own)


class BusyClock:
    """A step's wall time and the time the training thread was blocked in collectives (host clock, or CUDA
    events on a GPU); `boundary` gives the difference."""

    def __init__(self) -> None:
        self.start = _monotonic()
        self.thread = threading.get_ident()  # the training thread: the optimizer step's (set at each boundary)
        self.blocked = 0.0  # host seconds in the training thread's waits since the boundary
        self.ddp_blocked = 0.0  # host seconds from DDP's last bucket issued to its all-reduce done (a comm thread's)
        self.timing = False  # steps are long: waits are timed and DDP modules hooked
        self.reporting = False  # a wait or a DDP bucket was timed: the steps carry `busy`
        self._issued = 0.0
        self._issued_event: Any = None  # the same on a GPU: a CUDA event
        self._cuda: CudaSteps | None = None
        self._broken = False  # CUDA timing failed once (reported as no busy time from then on, never raised)
        self._steps: deque[bool] = deque(maxlen=WINDOW)  # the last steps: long (>= TIMED_FROM_S)? until timing starts
        self._long = 0  # how many of them were long: their upper median is long when at least half are (no sort a step)
        self._warmup = WARMUP
        #: DDP modules seen at a first forward, not timed yet, and what times one (`install`'s).
        self.waiting: list[weakref.ref[Any]] = []
        self.time_module: Callable[[Any], None] = lambda module: None
        self.time_waits: Callable[[], None] = lambda: None  # puts the timed `Work.wait` in place (`install`'s)
        #: True in a thread running a backward for the training thread (autograd's device threads on a GPU,
        #: where FSDP's backward hooks wait): `install`'s, from torch's graph task id as FSDP2 reads it.
        self.in_backward: Callable[[], bool] = lambda: False

    # -- the waits ------------------------------------------------------------------------------
    def wait_begin(self) -> Any:
        """Before a collective's wait on the training thread: a token for `wait_end`."""
        if self._cuda is not None:
            return self._cuda_record()
        return _monotonic()

    def wait_end(self, token: Any) -> None:
        if self._cuda is not None:
            end = self._cuda_record()
            if token is not None and end is not None:
                self._cuda.waits.append((token, end))
        elif not self._broken:
            self.blocked += _monotonic() - token
        self.reporting = True

    def bucket_issued(self, tensor: Any) -> None:
        """From DDP's hook, once the step's last bucket is handed to its all-reduce."""
        if self._broken:
            return
        if getattr(tensor, "is_cuda", False) and (self._cuda is None or self._cuda.device != tensor.device):
            self._cuda = CudaSteps(tensor.device)  # a script's own hook before the steps are long, or the current
            # device is not the gradients'
        if self._cuda is not None:  # every time of the step is an event then, on one device's stream
            self._issued_event = self._cuda_record()
        else:
            self._issued = _monotonic()
        self.reporting = True

    def bucket_done(self, fut: Any) -> Any:
        """The callback chained on the last bucket's future (a comm thread's, or CUDA's): its value unchanged."""
        if self._cuda is not None:
            done, issued = self._cuda_record(), self._issued_event
            if done is not None and issued is not None and self._cuda is not None:
                self._cuda.ddp = (issued, done)
        elif not self._broken:
            self.ddp_blocked += _monotonic() - self._issued
        return fut.value()

    # -- the step -------------------------------------------------------------------------------
    def boundary(self, now: float) -> float | None:
        """At the optimizer step: this rank's own work in the step that ended (None: none timed)."""
        wall, self.start = now - self.start, now
        self.thread = threading.get_ident()
        if not self.timing:
            self._time_when_long(wall)
        blocked, self.blocked, self.ddp_blocked = self.blocked + self.ddp_blocked, 0.0, 0.0
        if not self.reporting:
            return None
        if self._cuda is not None:
            try:
                return self._cuda.boundary()
            except Exception:  # noqa: BLE001 - telemetry never fails the user's optimizer step
                self._cuda_failed()
                return None
        return None if self._broken else max(0.0, wall - blocked)

    def _time_when_long(self, step: float) -> None:
        if self._warmup > 0:
            self._warmup -= 1
            return
        steps, long = self._steps, step >= TIMED_FROM_S
        if len(steps) == WINDOW and steps[0]:
            self._long -= 1
        steps.append(long)
        self._long += long
        if len(steps) < WINDOW or self._long < WINDOW - WINDOW // 2 or not _group_up():
            return
        self.timing = True
        steps.clear()
        self._long = 0
        if _cuda_in_use():
            try:
                import torch

                if self._cuda is None:  # its first boundary event is the first reporting step's end
                    self._cuda = CudaSteps(torch.device("cuda", torch.cuda.current_device()))
            except Exception:  # noqa: BLE001 - as in `boundary`
                self._cuda_failed()
        self.time_waits()
        modules, self.waiting = [ref() for ref in self.waiting], []
        for module in modules:
            if module is not None:
                self.time_module(module)

    def _cuda_record(self) -> Any:
        try:
            return self._cuda.record() if self._cuda is not None else None
        except Exception:  # noqa: BLE001 - as in `boundary`
            self._cuda_failed()
            return None

    def _cuda_failed(self) -> None:
        self._broken, self._cuda, self.reporting = True, None, False


class CudaSteps:
    """The CUDA events of the steps: one at each boundary, a pair per timed wait; read without blocking at a
    later boundary, once every event of a step has completed."""

    def __init__(self, device: Any) -> None:
        self.device = device  # where the events are recorded: the gradients' device (DDP) or the current one
        self.start: Any = None  # the event of the last boundary
        self.waits: list[tuple[Any, Any]] = []  # (before, after) each timed wait since it
        self.ddp: tuple[Any, Any] | None = None  # (issued, done) of DDP's last bucket since it
        self.pending: deque[tuple[Any, Any, list[tuple[Any, Any]]]] = deque(maxlen=8)

    def record(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        # On this device's stream, not the thread's current device: a script that moves its model to
        # cuda:LOCAL_RANK without `torch.cuda.set_device` stays on cuda:0, and events of two devices cannot be
        # compared.
        event.record(torch.cuda.current_stream(self.device))
        return event

    def boundary(self) -> float | None:
        end = self.record()
        waits = self.waits + ([self.ddp] if self.ddp is not None else [])
        if self.start is not None:
            self.pending.append((self.start, end, waits))
        self.start, self.waits, self.ddp = end, [], None
        # One step read a boundary, the oldest complete: its value goes into this step's event, a constant
        # few steps late. Draining every complete step and reporting only the newest left most step events
        # without `busy` on a GPU (the host runs ahead of the stream in bursts), and a step without it resets
        # the rank's recent own work (telemetry/ranks.py): the straggler detector fell back to step times.
        if not (self.pending and _complete(self.pending[0])):
            return None
        start, end, waits = self.pending.popleft()
        blocked = sum(float(before.elapsed_time(after)) for before, after in waits)
        return max(0.0, float(start.elapsed_time(end)) - blocked) / 1000.0


def _complete(step: tuple[Any, Any, list[tuple[Any, Any]]]) -> bool:
    start, end, waits = step
    return bool(end.query() and start.query() and all(b.query() and a.query() for b, a in waits))


def _group_up() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized())


def _cuda_in_use() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def waited(clock: BusyClock, wait: Callable[..., Any], work: Any, *args: Any, **kwargs: Any) -> Any:
    """`wait(work, ...)`, timed as a wait of the step when it is the training thread's or its backward's."""
    if threading.get_ident() != clock.thread and not clock.in_backward():  # a background writer's: blocks no step
        return wait(work, *args, **kwargs)
    token = clock.wait_begin()
    try:
        return wait(work, *args, **kwargs)
    finally:
        clock.wait_end(token)


class _Slot:
    """The hook DDP calls: the script's hook or DDP's reference all-reduce, the last bucket's wait timed."""

    def __init__(self, clock: BusyClock, hook: Callable[..., Any], state: Any) -> None:
        self.clock, self.hook, self.state = clock, hook, state


def _timed(slot: _Slot, bucket: Any) -> Any:
    fut = slot.hook(slot.state, bucket)
    if not bucket.is_last():
        return fut
    slot.clock.bucket_issued(bucket.buffer())
    return fut.then(slot.clock.bucket_done)


# DDP refuses a hook whose `bucket` or return annotations are not its types (here strings: postponed
# annotations), and accepts none at all.
del _timed.__annotations__["bucket"], _timed.__annotations__["return"]


def install(clock: BusyClock, patches: Patches) -> Callable[[], None]:
    """Note every DDP module at its first forward and make `clock` able to time waits, for it to start once
    steps are long; returns what the first optimizer step calls (removes the pre-hook)."""
    try:
        import torch
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.distributed.distributed_c10d import Work
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:  # torch without distributed
        return lambda: None
    register = DDP.register_comm_hook
    wait = Work.wait

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

    def timed_wait(work: Any, *args: Any, **kwargs: Any) -> Any:
        return waited(clock, wait, work, *args, **kwargs)

    def attach(module: Any, _args: Any) -> None:
        if not isinstance(module, DDP) or getattr(module, "_resctl_busy_seen", False):
            return
        setattr(module, "_resctl_busy_seen", True)  # noqa: B010 - a Module's __setattr__ is typed for tensors
        if getattr(module, "_resctl_busy_slot", None) is None:
            clock.waiting.append(weakref.ref(module))

    clock.time_module = time_module
    clock.time_waits = lambda: patches.set(Work, "wait", timed_wait)
    graph_task = getattr(torch._C, "_current_graph_task_id", None)  # private: resctl.launch.nvrx_private
    if graph_task is not None:
        clock.in_backward = lambda: bool(graph_task() != -1)
    patches.set(DDP, "register_comm_hook", register_timed)
    handle = register_module_forward_pre_hook(attach)
    patches.on_undo(handle.remove)
    return handle.remove
