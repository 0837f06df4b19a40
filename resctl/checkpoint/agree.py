"""Cross-rank agreement at the start of `load`, in a cost that does not grow with the job.

Two questions every rank asks before it restores a memory snapshot:

- **Which steps does every rank hold?** The intersection of each rank's newest `width` steps.
  `common_steps` answers it with one broadcast of rank 0's `width` steps and one all-reduce(MIN)
  of `width` presence flags: O(width) bytes per rank, and the O(log N) latency of a tree
  collective. (It was an all-gather of every rank's list: N x width values per rank.)
- **Where is my buddy node's replica server?** `buddy_addr` has each rank set its node's address
  under one key per node in the process group's store and read only its buddy's key: two store
  round trips per rank. (It was an all-gather of every rank's 2 KB address row: 16 MB per rank
  at 8,192 ranks.) The buddy of node n is node (n+1) % nodes (`replica.buddy`), torchelastic's
  group ranks being 0 .. GROUP_WORLD_SIZE-1.

The algorithms take their collectives and store as arguments, so they are tested without torch;
`torch_collectives` and `default_store` bind them to torch.distributed. bench/scale measures both.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Protocol, Sequence

from resctl.checkpoint import replica

#: The store key prefix of the replica addresses (one key per node).
ADDR_PREFIX = "resctl/replica/addr/"
NO_STEP = -1

Broadcast = Callable[[list[int]], list[int]]  # rank 0's list (same length on every rank)
AllMin = Callable[[list[int]], list[int]]  # element-wise minimum over the ranks


class KeyStore(Protocol):
    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...


def common_steps(local: Sequence[int], width: int, broadcast: Broadcast, all_min: AllMin) -> list[int]:
    """The steps every rank has, newest first, each rank giving its newest `width` (the same
    `width` on all ranks; collective: every rank calls it)."""
    mine = sorted(set(local), reverse=True)[:width]
    padded = mine + [NO_STEP] * (width - len(mine))
    candidates = broadcast(padded)
    held = set(mine)
    flags = all_min([1 if s != NO_STEP and s in held else 0 for s in candidates])
    return sorted((s for s, f in zip(candidates, flags) if f and s != NO_STEP), reverse=True)


def buddy_addr(store: KeyStore, node: int, nodes: int, own: str) -> str | None:
    """The replica server address of `node`'s buddy ("" or absent there: None). Every rank of a
    node sets the same value; `get` blocks until the buddy node's ranks have set theirs."""
    target = replica.buddy(node, list(range(nodes)))
    store.set(f"{ADDR_PREFIX}{node}", own)
    if target is None:
        return None
    return store.get(f"{ADDR_PREFIX}{target}").decode(errors="replace") or None


# --- torch.distributed bindings -------------------------------------------------------------


def torch_collectives() -> tuple[Broadcast, AllMin]:
    """`common_steps`'s collectives over the default process group (CPU tensors, CUDA for NCCL)."""
    import torch
    import torch.distributed as dist

    def device() -> Any:
        if "nccl" in str(dist.get_backend()).lower():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def broadcast(values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64, device=device())
        dist.broadcast(t, src=0)
        return [int(v) for v in t.tolist()]

    def all_min(values: list[int]) -> list[int]:
        t = torch.tensor(values, dtype=torch.int64, device=device())
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return [int(v) for v in t.tolist()]

    return broadcast, all_min


def common_steps_dist(local: Sequence[int], width: int) -> list[int]:
    """`common_steps` over the default process group."""
    return common_steps(local, width, *torch_collectives())


def default_store() -> Any:
    """The default process group's store (its timeout is the group's), or None."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no default group, or one without a store
        return None


def buddy_addr_dist(own: str, fallback: Callable[[str], str | None]) -> str | None:
    """`buddy_addr` for this worker (torchelastic's GROUP_RANK of GROUP_WORLD_SIZE nodes) over the
    default group's store; `fallback(own)` (the all-gather) when either is missing."""
    nodes = os.environ.get("GROUP_WORLD_SIZE", "")
    store = default_store() if nodes.isdigit() else None
    if store is None:
        return fallback(own)
    return buddy_addr(store, int(os.environ.get("GROUP_RANK", "0")), int(nodes), own)
