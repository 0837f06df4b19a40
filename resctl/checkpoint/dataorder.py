"""The index arithmetic of a data position, pure: the order DistributedSampler and RandomSampler
give a pass, the share of one rank when the world size changed, batching, and skipping into an index
stream. No state and no patches (`resctl.checkpoint.dataposition` is the patch layer);
tests/unit/test_data_position.py checks these against torch's samplers, tests/unit/test_dataorder.py
their properties.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import torch

_ITERATORS: tuple[type, ...] = (type(iter([])), type(iter(range(0))))  # positionable in O(1) by __setstate__


def global_order(n: int, shuffle: bool, seed: int, epoch: int) -> list[int]:
    """DistributedSampler's order of the whole dataset in `epoch`, before padding and subsampling."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def resplit(order: Sequence[int], consumed: int, num_replicas: int, rank: int, drop_last: bool) -> list[int]:
    """`rank`'s share of what remains of `order` after the job consumed its first `consumed` samples,
    split as DistributedSampler splits a whole epoch: padded from the order's head (or cut) to a
    multiple of `num_replicas`, then every `num_replicas`-th. With the world size that consumed them
    this is exactly the tail of the rank's own stream; with another, every remaining sample is seen
    once (plus padding)."""
    rest = list(order[consumed:]) if consumed < len(order) else []
    if drop_last:
        rest = rest[: len(rest) // num_replicas * num_replicas]
    elif rest and len(order):
        pad = -len(rest) % num_replicas
        rest += (list(order) * math.ceil(pad / len(order)))[:pad] if pad else []
    return rest[rank::num_replicas]


def batched(indices: Iterator[int], batch_size: int, drop_last: bool) -> Iterator[list[int]]:
    """BatchSampler's batching of an index stream."""
    if drop_last:
        for full in zip(*[indices] * batch_size):
            yield [*full]
        return
    batch = [*itertools.islice(indices, batch_size)]
    while batch:
        yield batch
        batch = [*itertools.islice(indices, batch_size)]


def skip_into(it: Iterator[Any], count: int) -> Iterator[Any]:
    """`it` advanced by `count` items: O(1) for list and range iterators, else by drawing them
    (indices only, never samples)."""
    if count <= 0:
        return it
    if type(it) in _ITERATORS:
        it.__setstate__(count)  # type: ignore[attr-defined]
        return it
    next(itertools.islice(it, count - 1, count), None)
    return it


def random_order(n: int, num_samples: int, generator: torch.Generator) -> list[int]:
    """RandomSampler's order without replacement, as one list (torch yields it from per-`n` permutations)."""
    out: list[int] = []
    for _ in range(num_samples // n):
        out += torch.randperm(n, generator=generator).tolist()
    out += torch.randperm(n, generator=generator).tolist()[: num_samples % n]
    return out
