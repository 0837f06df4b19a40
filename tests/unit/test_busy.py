"""A rank's own work in a synchronous step (resctl.shim.busy): the step's wall time less the time the training
thread was blocked in collectives; on a GPU the same from CUDA events, read once complete. Pure: the host
clock and the events are the test's own."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resctl.shim import busy


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(busy, "_monotonic", clock)
    return clock


def _reporting(now: Clock) -> busy.BusyClock:
    clock = busy.BusyClock()
    clock.timing = clock.reporting = True
    return clock


def test_own_work_is_the_step_less_its_waits_wherever_they_come(now: Clock) -> None:
    clock = _reporting(now)
    # 10 ms of work, a 25 ms wait (an all-gather), 5 ms of work, a 20 ms wait (a reduce-scatter), 40 ms after
    # the last wait (clipping, logging on a slow host): 55 ms of own work in a 100 ms step.
    now.now += 0.010
    token = clock.wait_begin()
    now.now += 0.025
    clock.wait_end(token)
    now.now += 0.005
    token = clock.wait_begin()
    now.now += 0.020
    clock.wait_end(token)
    now.now += 0.040
    assert clock.boundary(now.now) == pytest.approx(0.055)
    now.now += 0.030  # a step without a wait: all of it is own work
    assert clock.boundary(now.now) == pytest.approx(0.030)


def test_ddps_wait_is_its_last_bucket_from_issued_to_done(now: Clock) -> None:
    class Fut:
        def value(self) -> str:
            return "grads"

    clock = _reporting(now)
    now.now += 0.012  # forward and backward up to the last bucket
    clock.bucket_issued(object())
    now.now += 0.040  # the all-reduce waits for a slower peer
    assert clock.bucket_done(Fut()) == "grads"  # the future's value goes on unchanged
    now.now += 0.003  # the optimizer step
    assert clock.boundary(now.now) == pytest.approx(0.015)


def test_no_busy_time_until_something_is_timed(now: Clock) -> None:
    clock = busy.BusyClock()
    now.now += 0.050
    assert clock.boundary(now.now) is None  # a job with no timed wait and no DDP hook: step times compare it


def test_only_the_training_threads_waits_count(now: Clock) -> None:
    clock = _reporting(now)
    calls = []

    def wait(work: Any, timeout: float = 0.0) -> bool:
        calls.append((work, timeout))
        now.now += 0.030
        return True

    other = threading.Thread(target=busy.waited, args=(clock, wait, "writer's work"))
    other.start()
    other.join()
    assert busy.waited(clock, wait, "work", timeout=5.0) is True
    now.now += 0.010
    assert calls == [("writer's work", 0.0), ("work", 5.0)]
    # 70 ms of step: the training thread's 30 ms wait is not its own work, a background writer's wait is.
    assert clock.boundary(now.now) == pytest.approx(0.040)
    # A wait in autograd's thread of a backward the training thread runs (FSDP's hooks on a GPU) is the step's.
    clock.in_backward = lambda: threading.get_ident() != clock.thread
    other = threading.Thread(target=busy.waited, args=(clock, wait, "reduce-scatter"))
    other.start()
    other.join()
    now.now += 0.010
    assert clock.boundary(now.now) == pytest.approx(0.010)


def test_a_wait_that_raises_is_timed_and_raises(now: Clock) -> None:
    clock = _reporting(now)

    def wait(work: Any) -> None:
        now.now += 0.020
        raise RuntimeError("peer gone")

    with pytest.raises(RuntimeError, match="peer gone"):
        busy.waited(clock, wait, "work")
    now.now += 0.005
    assert clock.boundary(now.now) == pytest.approx(0.005)


class Event:
    """A CUDA event at `t` ms that has completed once the test says so."""

    def __init__(self, t: float, done: bool = True) -> None:
        self.t, self.done = t, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: Event) -> float:
        return end.t - self.t


def test_cuda_own_work_is_read_from_events_once_they_complete() -> None:
    steps = busy.CudaSteps("cuda:0")
    times = iter([0.0, 10.0, 35.0, 100.0, 100.0, 130.0, 160.0, 200.0])
    recorded: list[Event] = []

    def record() -> Event:
        recorded.append(Event(next(times), done=False))
        return recorded[-1]

    steps.record = record  # type: ignore[method-assign]
    assert steps.boundary() is None  # the first boundary: where the first step starts
    steps.waits.append((steps.record(), steps.record()))  # a 25 ms wait
    assert steps.boundary() is None  # the step's events are still queued on the GPU: not read, not blocked on
    steps.ddp = (steps.record(), steps.record())  # DDP's last bucket: 30 ms from issued to done
    for event in recorded[:5]:
        event.done = True
    assert steps.boundary() == pytest.approx(0.075)  # the first step: 100 ms less its 25 ms wait
    for event in recorded:
        event.done = True
    assert steps.boundary() == pytest.approx(0.030)  # the second: 60 ms less DDP's 30 ms wait
    assert not steps.pending[-1][1].done  # the third (from 160 ms) waits for its end event


def test_cuda_steps_that_complete_together_are_reported_one_a_boundary() -> None:
    """The host runs ahead of the GPU in bursts: steps that complete together are read one a boundary, so every
    step event after the first few carries `busy` (a step without it resets the rank's recent own work)."""
    steps = busy.CudaSteps("cuda:0")
    clock = iter(float(t) for t in range(0, 1000, 10))
    recorded: list[Event] = []

    def record() -> Event:
        recorded.append(Event(next(clock), done=False))
        return recorded[-1]

    steps.record = record  # type: ignore[method-assign]
    seen = [steps.boundary() for _ in range(4)]  # nothing complete yet: the GPU is three steps behind
    assert seen == [None, None, None, None]
    for event in recorded:
        event.done = True  # the three steps complete at once
    seen = [steps.boundary() for _ in range(3)]
    assert seen == [pytest.approx(0.010)] * 3  # one a boundary, oldest first: none dropped


def test_on_a_gpu_every_time_of_the_step_is_an_event_of_the_gradients_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock's GPU path end to end with stand-in events: a wait and DDP's last bucket as event pairs, the step
    between two boundary events, the gradients' device taking over from the current one."""
    times = iter([0.0, 2.0, 5.0, 25.0, 30.0, 70.0, 90.0, 100.0])
    devices = []

    class Steps(busy.CudaSteps):
        def record(self) -> Event:
            devices.append(self.device)
            return Event(next(times))

    class Grad:
        is_cuda = True
        device = "cuda:1"

    class Fut:
        def value(self) -> str:
            return "grads"

    clock = busy.BusyClock()
    clock.timing = clock.reporting = True
    clock._cuda = Steps("cuda:0")  # the current device when timing started
    monkeypatch.setattr(busy, "CudaSteps", Steps)  # what bucket_issued makes for the gradients' device
    clock.bucket_issued(Grad())  # 0 ms: the gradients live on cuda:1, the clock moves there
    clock.bucket_done(Fut())  # 2 ms
    assert clock.boundary(0.0) is None  # 5 ms: the first boundary on cuda:1 starts its first step
    clock.wait_end(clock.wait_begin())  # 25-30 ms: a 5 ms wait
    clock.bucket_issued(Grad())  # 70 ms
    assert clock.bucket_done(Fut()) == "grads"  # 90 ms: DDP waited 20 ms; the future's value goes on
    assert clock.boundary(0.0) == pytest.approx((100.0 - 5.0 - 5.0 - 20.0) / 1000)  # 100 ms; all complete: read
    assert devices == ["cuda:1"] * 8


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0.0, busy.TIMED_FROM_S / 2, busy.TIMED_FROM_S, busy.TIMED_FROM_S * 3]),
                max_size=3 * (busy.WARMUP + busy.WINDOW)))
def test_timing_starts_where_the_last_windows_upper_median_is_long(steps: list[float]) -> None:
    """The count of long steps (kept a step at a time) starts timing at the step where sorting the last `WINDOW`
    steps after the `WARMUP` would have: its upper median long, i.e. at least half of them long."""
    clock = busy.BusyClock()
    expected, started = None, None
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(busy, "_group_up", lambda: True)
        mp.setattr(busy, "_cuda_in_use", lambda: False)
        for i, step in enumerate(steps):
            window = steps[busy.WARMUP:i + 1][-busy.WINDOW:]
            if expected is None and i >= busy.WARMUP and len(window) == busy.WINDOW and \
                    sorted(window)[busy.WINDOW // 2] >= busy.TIMED_FROM_S:
                expected = i
            if not clock.timing:
                clock._time_when_long(step)
                if clock.timing:
                    started = i
    assert started == expected
