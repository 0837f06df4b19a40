"""The stop-step protocol (resctl/shim/stopstep.py) over a real TCPStore; threads play the ranks."""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from resctl.shim.stopstep import StopStep, StopStepUnavailable


@pytest.fixture
def store() -> Iterator[dist.Store]:
    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    yield dist.PrefixStore("job", server)


def test_every_rank_learns_the_largest_proposal(store: dist.Store) -> None:
    ranks = [StopStep(store, r, 3) for r in range(3)]
    for r, step in zip(ranks, (20, 21, 20)):
        r.propose(step)
    assert [r.agree(timeout=5) for r in ranks] == [21, 21, 21]


def test_no_agreement_until_every_rank_proposed(store: dist.Store) -> None:
    a, b = StopStep(store, 0, 2), StopStep(store, 1, 2)
    a.propose(7)
    t0 = time.monotonic()
    with pytest.raises(StopStepUnavailable, match="1 of 2 ranks proposed"):
        a.agree(timeout=0.5)
    assert 0.4 <= time.monotonic() - t0 < 3
    b.propose(8)
    assert a.agree(timeout=5) == 8


def test_a_proposal_wakes_the_other_ranks_watch(store: dist.Store) -> None:
    a, b = StopStep(store, 0, 2), StopStep(store, 1, 2)
    woke = threading.Event()
    b.watch(woke.set)
    time.sleep(0.1)
    assert not woke.is_set()
    a.propose(3)
    assert woke.wait(5)


def test_the_first_claim_alone_proposes(store: dist.Store) -> None:
    a = StopStep(store, 0, 1)
    assert a.claim() and not a.claim()


def test_a_closed_group_ignores_its_wake_key(store: dist.Store) -> None:
    a, b = StopStep(store, 0, 2), StopStep(store, 1, 2)
    woke = threading.Event()
    b.watch(woke.set)
    b.close()
    a.propose(3)
    assert not woke.wait(0.5)


def test_a_rank_whose_proposal_never_reached_the_store_does_not_wait_for_it(store: dist.Store) -> None:
    a = StopStep(store, 0, 2)
    with pytest.raises(StopStepUnavailable, match="did not reach the store"):
        a.agree(timeout=0.2)


def test_a_gone_store_is_no_agreement_and_no_hang() -> None:
    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=datetime.timedelta(seconds=2))
    a = StopStep(client, 0, 2)
    del server  # the host of the store is gone
    a.propose(5)  # does not raise
    t0 = time.monotonic()
    with pytest.raises(StopStepUnavailable):
        a.agree(timeout=3)
    assert time.monotonic() - t0 < 10


def test_a_rank_without_step_boundaries_does_not_hold_the_others_back(store: dist.Store) -> None:
    from resctl.shim.stopstep import ANY_STEP

    saver, other = StopStep(store, 0, 2), StopStep(store, 1, 2)  # only rank 0 calls maybe_save
    other.propose(ANY_STEP)
    saver.propose(12)
    assert saver.agree(timeout=5) == 12
    # ... nor its exit: rank 0, hosting the store, waits for no read of a rank that stops at no step
    # (it waited out its whole timeout before: 10 s at every stop of a job where only rank 0 saves).
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (saver.outlast_agreement(timeout=600), done.set()), daemon=True)
    waiter.start()
    assert done.wait(120), "rank 0 waited for a read that never comes"


class _Counted:
    """A store that counts the keys each call touches (its clones share the count)."""

    def __init__(self, store: dist.Store, keys: list[int]) -> None:
        self._store, self.keys = store, keys

    def clone(self) -> _Counted:
        return _Counted(self._store.clone(), self.keys)

    def __getattr__(self, name: str) -> object:
        method = getattr(self._store, name)

        def call(*args: object) -> object:
            if name != "set_timeout":
                self.keys[0] += len(args[0]) if isinstance(args[0], list) else 1  # type: ignore[arg-type]
            return method(*args)

        return call


def test_a_rank_touches_a_few_keys_whatever_the_world_size(store: dist.Store) -> None:
    """The O(1)-per-rank cost bench/scale measures: 32 ranks, proposals a step apart, each rank's
    propose + agree touches a handful of keys (the version before touched 2 x N), the first
    proposer's single wake request aside."""
    n = 32
    counts = [[0] for _ in range(n)]
    ranks = [StopStep(_Counted(store, counts[r]), r, n) for r in range(n)]  # type: ignore[arg-type]
    threads = [threading.Thread(target=s.propose, args=(100 + r % 2,)) for r, s in enumerate(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {s.agree(timeout=10) for s in ranks} == {101}
    first = max(range(n), key=lambda r: counts[r][0])
    assert max(c[0] for r, c in enumerate(counts) if r != first) <= 8
    assert counts[first][0] <= 8 + n
