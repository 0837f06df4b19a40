"""Properties of the data position's index arithmetic (resctl/checkpoint/dataorder.py), over any sizes:
a re-split covers what remains exactly once, with the world size that consumed it it is the rank's own
tail, batching loses nothing, and skipping into a stream equals dropping its head."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from resctl.checkpoint import dataorder

sizes = st.integers(min_value=1, max_value=200)
worlds = st.integers(min_value=1, max_value=9)


@given(n=sizes, consumed=st.integers(min_value=0, max_value=250), world=worlds, seed=st.integers(0, 2**16))
def test_a_resplit_covers_the_rest_once_plus_padding(n: int, consumed: int, world: int, seed: int) -> None:
    order = dataorder.global_order(n, True, seed, 0)
    shares = [dataorder.resplit(order, consumed, world, rank, drop_last=False) for rank in range(world)]
    rest = order[consumed:]
    together = sorted(itertools.chain.from_iterable(shares))
    assert set(rest) <= set(together)
    assert len(together) == len(rest) + (-len(rest) % world)  # padded to a multiple of the world size
    assert len({len(s) for s in shares}) <= 1  # every rank takes the same number of steps


@given(n=sizes, consumed=st.integers(min_value=0, max_value=250), world=worlds)
def test_a_resplit_with_drop_last_is_a_multiple_of_the_world_and_has_no_repeats(n: int, consumed: int,
                                                                              world: int) -> None:
    order = list(range(n))
    shares = [dataorder.resplit(order, consumed, world, rank, drop_last=True) for rank in range(world)]
    together = list(itertools.chain.from_iterable(shares))
    assert len(together) == len(set(together)) == len(order[consumed:]) // world * world
    assert set(together) <= set(order[consumed:])


@settings(max_examples=60)
@given(n=sizes, world=worlds, data=st.data())
def test_with_the_same_world_a_resplit_is_the_tail_of_the_ranks_own_stream(n: int, world: int,
                                                                           data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, world - 1))
    sampler = DistributedSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=True, seed=3)
    own = list(sampler)
    taken = data.draw(st.integers(0, len(own)))
    order = dataorder.global_order(n, True, 3, 0)
    assert dataorder.resplit(order, taken * world, world, rank, drop_last=False) == own[taken:]


@given(indices=st.lists(st.integers(), max_size=60), size=st.integers(1, 9), drop_last=st.booleans())
def test_batching_keeps_every_index_in_order(indices: list[int], size: int, drop_last: bool) -> None:
    batches = list(dataorder.batched(iter(indices), size, drop_last))
    assert all(len(b) == size for b in batches[:-1])
    kept = len(indices) // size * size if drop_last else len(indices)
    assert list(itertools.chain.from_iterable(batches)) == indices[:kept]


@given(indices=st.lists(st.integers(), max_size=60), count=st.integers(-3, 80),
       kind=st.sampled_from(["list", "range", "generator"]))
def test_skipping_into_a_stream_drops_its_head(indices: list[int], count: int, kind: str) -> None:
    source = {"list": lambda: iter(indices), "range": lambda: iter(range(len(indices))),
              "generator": lambda: (i for i in indices)}[kind]
    expected = list(source())[max(count, 0):]
    assert list(dataorder.skip_into(source(), count)) == expected


@given(n=st.integers(1, 40), num_samples=st.integers(1, 120), seed=st.integers(0, 2**16))
def test_the_random_order_is_random_samplers(n: int, num_samples: int, seed: int) -> None:
    ours = dataorder.random_order(n, num_samples, torch.Generator().manual_seed(seed))
    theirs = list(torch.utils.data.RandomSampler(range(n), num_samples=num_samples,
                                                 generator=torch.Generator().manual_seed(seed)))
    assert ours == theirs
