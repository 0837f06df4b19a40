"""The write queue: one background write in flight at a time, and the failed-save policy.

Both writers of the engine go through it: a plain save's persist (`resctl.checkpoint.disk`) and
the torch.save intercept (`resctl.checkpoint.intercept`), which sees the engine only as the
`WriteQueue` protocol below. The protocol of one save, in order:

1. `begin()` — heartbeat, wait for the write in flight (a failure of it is reported now through
   the policy); returns the seconds waited;
2. stage the state (the caller's business), `take_injected_failure()` once (a fault drill);
3. `submit(job, step, path)` — run `job` in the background when async, else now;
4. `end()` — heartbeat.

A write's `job` calls `tick()` while it runs (rate-limited heartbeats). A failed write is never
made visible: it is reported (log error, `ckpt_fail`), and the `max_failed_saves`-th failure in a
row raises `SaveFailuresExceeded` from the save or wait that notices it.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol

from resctl.checkpoint.errors import SaveFailuresExceeded
from resctl.telemetry.events import EventLog

log = logging.getLogger("resctl.checkpoint")

HEARTBEAT_EVERY = 1.0  # seconds between heartbeats sent from writer threads


class WriteQueue(Protocol):
    """What a writer outside the engine (the torch.save intercept) may use of it."""

    @property
    def events(self) -> EventLog: ...
    @property
    def run_id(self) -> str: ...
    @property
    def rank(self) -> int: ...
    def begin(self) -> float: ...
    def take_injected_failure(self) -> str | None: ...
    def submit(self, job: Callable[[], None], step: int | None, path: Path | None) -> None: ...
    def end(self) -> None: ...
    def tick(self) -> None: ...
    def pending_path(self) -> Path | None: ...
    def wait_previous(self) -> float: ...


class Heartbeat:
    """A zero-argument heartbeat, called at most once a second unless forced; never raises."""

    def __init__(self, fn: Callable[[], None] | None) -> None:
        self.fn = fn
        self._lock = threading.Lock()
        self._last = 0.0

    def beat(self, force: bool = False) -> None:
        if self.fn is None:
            return
        now = time.monotonic()
        with self._lock:
            if not force and now - self._last < HEARTBEAT_EVERY:
                return
            self._last = now
            try:
                self.fn()
            except Exception:
                log.debug("checkpoint heartbeat failed", exc_info=True)


class Writes:
    """The engine's write queue (implements `WriteQueue`).

    `async_` may change between saves (a final save is synchronous). `last_saved_step` is the step
    last saved or resumed; a failed write of that step clears it, so a final save tries it again."""

    def __init__(self, *, async_: bool, max_failed_saves: int, events: EventLog, heartbeat: Heartbeat,
                 run_id: str, rank: Callable[[], int], where: Path) -> None:
        self.async_ = async_
        self.max_failed_saves = max_failed_saves
        self._events = events
        self.heartbeat = heartbeat
        self._run_id = run_id
        self._rank = rank
        self._where = where
        self._bg = ThreadPoolExecutor(1, thread_name_prefix="resctl-ckpt")
        self._inflight: Future[None] | None = None
        self._inflight_step: int | None = None
        self._inflight_path: Path | None = None
        self._fail_next: str | None = None
        #: Writes that failed since the last one that landed.
        self.failed_in_a_row = 0
        self.last_saved_step: int | None = None

    @property
    def events(self) -> EventLog:
        return self._events

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def rank(self) -> int:
        return self._rank()

    def begin(self) -> float:
        self.heartbeat.beat(force=True)
        return self.wait_previous()

    def end(self) -> None:
        self.heartbeat.beat(force=True)

    def tick(self) -> None:
        """Heartbeat from a writer or reader thread (rate-limited)."""
        self.heartbeat.beat()

    def fail_next_write(self, message: str) -> None:
        self._fail_next = message

    def take_injected_failure(self) -> str | None:
        """The pending fault-drill message, cleared (taken when a save is staged)."""
        message, self._fail_next = self._fail_next, None
        return message

    def pending_path(self) -> Path | None:
        """The final path of the write in flight, if any."""
        fut = self._inflight
        return self._inflight_path if fut is not None and not fut.done() else None

    @property
    def inflight(self) -> Future[None] | None:
        return self._inflight

    def wait_previous(self) -> float:
        """Wait for the write in flight; return the seconds waited. A failed write is reported
        (`record_failure`), and raises only when it makes `max_failed_saves` in a row."""
        fut, step = self._inflight, self._inflight_step
        if fut is None:
            return 0.0
        t0 = time.monotonic()
        try:
            fut.result()
        except Exception as err:  # noqa: BLE001 - every write failure goes through the policy
            self.record_failure(step, err)
        else:
            self.failed_in_a_row = 0
        finally:
            self._inflight = None
            self._inflight_step = None
            self._inflight_path = None
        return time.monotonic() - t0

    def submit(self, job: Callable[[], None], step: int | None, path: Path | None) -> None:
        """Run `job` (a write) in the background when async, else now; a failure goes through
        `record_failure` (now when sync, at the next save()/wait() when async)."""
        if self.async_:
            self._inflight = self._bg.submit(job)
            self._inflight_step, self._inflight_path = step, path
            return
        try:
            job()
        except Exception as err:  # noqa: BLE001
            self.record_failure(step, err)
        else:
            self.failed_in_a_row = 0

    def record_failure(self, step: int | None, err: BaseException) -> None:
        """A write failed (it was never made visible): report it loudly and let the next interval
        retry; raise `SaveFailuresExceeded` when it is the `max_failed_saves`-th in a row."""
        self.failed_in_a_row += 1
        if step is not None and self.last_saved_step == step:
            self.last_saved_step = None  # not saved: a final save may try this step again
        cause = f"{type(err).__name__}: {err}"
        self._events.emit("ckpt_fail", step=step, error=cause, consecutive=self.failed_in_a_row,
                          limit=self.max_failed_saves)
        where = f"the newest complete checkpoint in {self._where} is still the one that loads"
        if self.failed_in_a_row >= self.max_failed_saves:
            raise SaveFailuresExceeded(
                f"checkpoint step {step} failed while writing ({cause}), {self.failed_in_a_row} failed writes in a row "
                f"(checkpoint.max_failed_saves = {self.max_failed_saves}). Nothing partial was made visible; {where}. "
                "Free space or fix permissions of the checkpoint dir, then restart the job."
            ) from err
        log.error("checkpoint step %s failed while writing (%s); not made visible, %s; the next save tries "
                  "again (%d of %d failures in a row allowed)", step, cause, where, self.failed_in_a_row,
                  self.max_failed_saves - 1)

    def close(self) -> None:
        self._bg.shutdown(wait=True)
