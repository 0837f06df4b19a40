"""resctl/checkpoint/agree.py: the load-time agreements, torch-free, with threads as the ranks."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from resctl.checkpoint import agree, replica


class Collectives:
    """Blocking broadcast / all-reduce(MIN) among `n` threads (one call of each per rank)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.barrier = threading.Barrier(n)
        self.slots: list[Any] = [None] * n
        self.calls = 0

    def bind(self, rank: int) -> tuple[Callable[[list[int]], list[int]], Callable[[list[int]], list[int]]]:
        def exchange(values: list[int]) -> list[list[int]]:
            self.slots[rank] = list(values)
            self.barrier.wait()
            every = list(self.slots)
            self.barrier.wait()
            return every

        def broadcast(values: list[int]) -> list[int]:
            return exchange(values)[0]

        def all_min(values: list[int]) -> list[int]:
            return [min(col) for col in zip(*exchange(values))]

        return broadcast, all_min


# How long a rank's thread may take before the test calls it stuck (a deadlock fails, late): not a time the code
# must keep. 10 s was once too short for the 4-thread property test in an xdist worker of a loaded 2-core box
# (load average 10+: it timed out on a draw that then passed when Hypothesis replayed it: FlakyFailure).
PATIENCE = 120


def run_ranks(lists: list[list[int]], width: int) -> list[list[int]]:
    coll = Collectives(len(lists))
    with ThreadPoolExecutor(len(lists)) as pool:
        futures = [pool.submit(agree.common_steps, steps, width, *coll.bind(r)) for r, steps in enumerate(lists)]
        return [f.result(timeout=PATIENCE) for f in futures]


def test_the_common_steps_newest_first_on_every_rank() -> None:
    got = run_ranks([[9, 8, 7], [9, 7, 5], [7, 9]], width=3)
    assert got == [[9, 7]] * 3


def test_no_common_step_is_an_empty_list_everywhere() -> None:
    assert run_ranks([[4], [5], []], width=2) == [[], [], []]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=6), min_size=1, max_size=5), st.integers(1, 4))
def test_same_as_the_intersection_of_each_ranks_newest(lists: list[list[int]], width: int) -> None:
    want = set(sorted(set(lists[0]), reverse=True)[:width])
    for steps in lists[1:]:
        want &= set(sorted(set(steps), reverse=True)[:width])
    got = run_ranks(lists, width)
    assert got == [sorted(want, reverse=True)] * len(lists)


class DictStore:
    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.ops = 0

    def set(self, key: str, value: str) -> None:
        self.ops += 1
        self.data[key] = value.encode()

    def get(self, key: str) -> bytes:
        self.ops += 1
        return self.data[key]


def test_each_node_finds_the_next_nodes_server_in_two_store_calls() -> None:
    store = DictStore()
    addrs = [f"10.0.0.{n}:7000" for n in range(4)]
    for n, a in enumerate(addrs):  # every node's address first: the real get blocks until it is set
        store.set(f"{agree.ADDR_PREFIX}{n}", a)
    store.ops = 0
    got = [agree.buddy_addr(store, n, 4, addrs[n]) for n in range(4)]
    assert got == [addrs[replica.buddy(n, [0, 1, 2, 3])] for n in range(4)] == addrs[1:] + addrs[:1]
    assert store.ops == 2 * 4


def test_a_buddy_without_a_server_and_a_lone_node_have_no_buddy() -> None:
    store = DictStore()
    store.set(f"{agree.ADDR_PREFIX}1", "")
    assert agree.buddy_addr(store, 0, 2, "10.0.0.0:1") is None
    assert agree.buddy_addr(DictStore(), 0, 1, "10.0.0.0:1") is None


def test_over_a_real_tcp_store_the_get_waits_for_the_buddy() -> None:
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    stores = [dist.PrefixStore("job", dist.TCPStore("127.0.0.1", server.port, None, False)) for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(agree.buddy_addr, stores[n], n, 3, f"h{n}:1") for n in range(3)]
        assert [f.result(timeout=PATIENCE) for f in futures] == ["h1:1", "h2:1", "h0:1"]
