"""The stop step: when a job is stopped, every rank saves its final checkpoint at the same step.

SIGTERM does not reach the ranks of a job at one instant: Slurm signals each node's step, Kubernetes
each pod, a launcher its own workers. A rank that saved at "its next step boundary" and left could
leave a peer that was already past that boundary inside the next step's collective, which then
failed, so the peer never made its final save. Here the ranks agree on the step instead, through
the store of the script's process group (a second and third connection to it, made once the group
exists: the launcher's rendezvous store under `resctl run`, as under torchrun; rank 0's where a
launcher gives the workers a port of their own):

1. The first rank to learn of the stop (its own SIGTERM, or the store's wake key) asks the
   checkpointer for a final save *first* and only then reads its latest step boundary `b`; it
   proposes `b + 1`, the boundary its training thread will reach next: it raises the one `max`
   key to its proposal (compare-and-set), adds one to the count and, being the first to count,
   sets every rank's wake key in one request. Because the request comes before the read, the
   training thread sees the request at the proposed boundary or at the one before it, never later.
2. Every other rank is woken by a thread blocked on its wake key (no cost to a training step: the
   boundary tests one flag it tested before) and proposes the same way; the rank whose count
   completes the world sets the `all` key.
3. At its first boundary with the request set, the training thread waits for `all` (a proposal
   needs no training thread, so none waits for a peer stuck in a collective), then reads S = the
   `max` key, the largest proposal. Each rank then saves at its first boundary >= S: the same
   step everywhere, and no rank is past it. Ranks before S train on to it; interval saves on the
   way happen as usual, identically on every rank.

What it costs as the job grows (bench/scale, docs/architecture.md): a rank makes 2-3 store round
trips to propose and 2 to agree, whatever the world size (a compare-and-set is retried only when
a larger proposal landed in between: at most the few distinct steps the ranks are at); the store
holds 3 keys plus one wake key per rank, and one request of the first proposer sets those. Each
rank holds two connections to the store besides its group's own (the wake thread's blocked wait
and the protocol's calls). An earlier version had every rank set every wake key and read every
proposal key (N keys each way per rank, N^2 at the store): at 1,024 simulated ranks 111 of them saw
their store calls time out and saved alone; this one agreed there with 0.13 s of store CPU.

When the agreement cannot be had within half of what is left of `checkpoint.sigterm_grace` (a peer
died, the store is gone), the rank saves at the boundary it is at, as a rank alone would.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable

from resctl.shim.agent_store import uses_agent_store

PREFIX = "resctl/stop/"
COUNT = PREFIX + "count"
ALL = PREFIX + "all"
MAX = PREFIX + "max"
READ = PREFIX + "read"  # ranks that have read the agreed step (rank 0, hosting the store, waits for them)
#: How long the wake thread's blocking wait lasts before it is renewed (c10d logs a timed-out wait).
WATCH_RENEW = datetime.timedelta(days=1)
#: Timeout of the other store calls (a store whose host hangs must not hold a stopping rank long).
CALL_TIMEOUT = datetime.timedelta(seconds=10)
#: The agreement's first blocking wait, then its poll interval (seconds): doubled after each poll up
#: to POLL_MAX, so that the ranks of a large job waiting for a dead peer load the store with at most
#: one request per rank per POLL_MAX (a timed-out blocking wait would be logged by c10d, a check is not).
FIRST_WAIT = 1.0
POLL = 0.05
POLL_MAX = 1.0
#: The proposal of a rank that has no step boundary (its script never calls maybe_save): any step.
ANY_STEP = 0


class StopStepUnavailable(Exception):
    """The ranks could not agree on a stop step in time (a peer gone, the store unreachable)."""


def wake_key(rank: int) -> str:
    """One wake key per rank, so that a rank can end its own wait (`close`) without waking the others."""
    return f"{PREFIX}wake/{rank}"


class StopStep:
    """One process group's stop-step agreement, over `store` (any `torch.distributed.Store` that can
    `clone()`: a new connection, so a blocked wait never holds up the script's own store calls)."""

    def __init__(self, store: Any, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self._ops = store.clone()
        self._ops.set_timeout(CALL_TIMEOUT)
        self._watch_store = store.clone()
        self._claim = threading.Lock()
        self._claimed = False
        #: Set once this rank's proposal is in the store (or failed to get there).
        self.proposed = threading.Event()
        self.proposal: int | None = None
        self.agreed = False  # this rank read the stop step: every rank had proposed
        self.closed = False
        self._watcher: threading.Thread | None = None

    def claim(self) -> bool:
        """True for the first caller only: it makes this rank's proposal."""
        with self._claim:
            first, self._claimed = not self._claimed, True
            return first

    def propose(self, step: int) -> None:
        """Publish this rank's proposal (any thread; 2-3 store round trips)."""
        self.proposal = step
        try:
            self._raise_max(step)
            count = self._ops.add(COUNT, 1)
            if count == 1:  # the first proposal: wake every rank, in one request
                self._ops.multi_set([wake_key(r) for r in range(self.world_size)], ["stop"] * self.world_size)
            if count >= self.world_size:
                self._ops.set(ALL, "1")
            if step == ANY_STEP:  # this rank stops at no step and reads none: rank 0 need not outlast it
                self._ops.add(READ, 1)
        except Exception:  # noqa: BLE001 - the store is gone: agree() says so
            pass
        finally:
            self.proposed.set()

    def _raise_max(self, step: int) -> None:
        """`MAX` = max(`MAX`, step) by compare-and-set: one round trip unless a smaller proposal
        landed since the value this rank last saw (then one more per such proposal)."""
        expected, want = "", str(step)
        while True:
            got = self._ops.compare_set(MAX, expected, want).decode()
            if got == want or int(got) >= step:
                return
            expected = got

    def agree(self, timeout: float, tick: Callable[[], None] | None = None) -> int:
        """The stop step: the largest proposal, once every rank has proposed. Raises
        `StopStepUnavailable` when that does not happen within `timeout` seconds. `tick` is called
        between polls while it waits (heartbeats: the wait may be long when a peer is gone)."""
        deadline = time.monotonic() + timeout
        if not self.proposed.wait(max(0.0, timeout)):
            raise StopStepUnavailable("this rank's proposal did not reach the store in time")
        try:
            self._wait_all(deadline, tick)
            step = int(self._ops.get(MAX))
        except Exception as err:  # noqa: BLE001 - timeout or store error, told apart for the message
            count = self._count()
            got = "the store is unreachable" if count is None else f"{count} of {self.world_size} ranks proposed"
            raise StopStepUnavailable(f"no agreement within {timeout:.1f} s ({got}; {type(err).__name__})") from None
        self.agreed = True
        try:  # rank 0 waits for this count only to keep its store up (outlast_agreement): the step stands either way
            self._ops.add(READ, 1)
        except Exception:  # noqa: BLE001
            pass
        return step

    def _wait_all(self, deadline: float, tick: Callable[[], None] | None) -> None:
        # One blocking wait first (the usual case: every rank proposes within milliseconds), then
        # polls with a growing interval (see POLL_MAX).
        first = min(deadline - time.monotonic(), FIRST_WAIT)
        if first <= 0:
            raise TimeoutError
        try:
            self._ops.wait([ALL], datetime.timedelta(seconds=first))
            return
        except Exception:  # noqa: BLE001 - timed out (or the store is gone: the polls say which)
            pass
        pause = POLL
        while not self._ops.check([ALL]):
            if tick is not None:
                tick()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            time.sleep(min(pause, left))
            pause = min(pause * 2, POLL_MAX)

    def _count(self) -> int | None:
        try:
            return int(self._ops.add(COUNT, 0))
        except Exception:  # noqa: BLE001
            return None

    def watch(self, on_wake: Callable[[], None]) -> None:
        """Start the thread that calls `on_wake` once some rank has proposed a stop."""
        self._watcher = threading.Thread(target=self._watch, args=(on_wake,), name="resctl-stop-step", daemon=True)
        self._watcher.start()

    def _watch(self, on_wake: Callable[[], None]) -> None:
        key = wake_key(self.rank)
        while not self.closed:
            try:
                self._watch_store.wait([key], WATCH_RENEW)
            except Exception:  # noqa: BLE001 - renewed after a timeout; a gone store ends the thread
                try:
                    if not self._watch_store.check([key]):
                        continue
                except Exception:  # noqa: BLE001
                    return
            if not self.closed:
                on_wake()
            return

    def outlast(self, timeout: float) -> None:
        """Rank 0, whose process hosts the group's store, at its clean end: wait (at most `timeout`)
        until every rank has closed, so that no rank's wait is cut by the store going away (under
        torchrun the store is the launcher's, and outlives every worker). Nothing to wait for when
        the store is the launcher's here too (resctl.launch.adapters._agent_store)."""
        if self.rank != 0 or uses_agent_store():
            return
        try:
            self._ops.wait([wake_key(r) for r in range(self.world_size)], datetime.timedelta(seconds=timeout))
        except Exception:  # noqa: BLE001 - a rank still running, or gone: leave anyway
            pass

    def outlast_agreement(self, timeout: float) -> None:
        """Rank 0, hosting the group's store, leaving on a stop it agreed on: wait (at most `timeout`) until every
        rank has read the stop step, so that none reads a store that went away with this process and saves
        "alone" (the same step, but told as a failed agreement; seen in CI beside CPU burners). Nothing to
        wait for when the store is the launcher's, or when the agreement failed (a peer gone)."""
        if self.rank != 0 or not self.agreed or uses_agent_store():
            return
        deadline = time.monotonic() + timeout
        try:
            while int(self._ops.add(READ, 0)) < self.world_size and time.monotonic() < deadline:
                time.sleep(POLL)
        except Exception:  # noqa: BLE001 - the store is this process's: a failure means nothing to wait for
            pass

    def close(self, join_timeout: float = 5.0) -> None:
        """This group is over (the script ended, or an in-process restart makes a new one): end the
        wait, and the thread, before the interpreter exits. A thread still inside the store's wait
        then would abort the process ("terminate called without an active exception": the wait
        returns when rank 0's store goes, and a daemon thread that takes the GIL back during
        finalization is unwound through C++); and c10d logs a wait cut by a closed connection."""
        if self.closed:
            return
        self.closed = True
        try:
            self._ops.set(wake_key(self.rank), "closed")
        except Exception:  # noqa: BLE001 - the store is gone already
            return
        watcher = self._watcher
        if watcher is not None and watcher is not threading.current_thread():
            watcher.join(join_timeout)


def open_for_default_group() -> StopStep | None:
    """A `StopStep` over the default process group's store, or None when there is none to use."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        return StopStep(store, dist.get_rank(), dist.get_world_size())
    except Exception:  # noqa: BLE001 - a store that cannot clone (FileStore, HashStore): ranks stop alone
        return None
