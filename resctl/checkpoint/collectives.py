"""What the ranks agree on when they load, as tensor collectives on the default process group
(object collectives would need numpy): rank 0's list of disk steps, each node's buddy address (the
all-gather fallback of `agree.buddy_addr_dist`), and the MIN of each rank's verdict on a candidate.
The memory steps every rank holds: `agree.common_steps_dist` (a cost that does not grow with N).

Every function here is collective: all ranks call it, in the same order (the engine's load).
"""

from __future__ import annotations

import os

import torch

from resctl.checkpoint import replica

# A candidate's verdict on one rank; the ranks agree on the MIN.
MISMATCH, SKIP, OK = 0, 1, 2
ADDR_BYTES = 256


def ready() -> bool:
    """torch.distributed is initialised (the ranks can agree)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def several() -> bool:
    """More than one rank takes part: a load must agree."""
    return ready() and torch.distributed.get_world_size() > 1


def _device() -> torch.device:
    # NCCL only reduces CUDA tensors; gloo and others take CPU ones.
    if "nccl" in str(torch.distributed.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_steps(steps: list[int]) -> list[int]:
    """Rank 0's list of steps, on every rank."""
    dev = _device()
    n = torch.tensor([len(steps)], dtype=torch.int64, device=dev)
    torch.distributed.broadcast(n, src=0)
    buf = torch.tensor(steps if torch.distributed.get_rank() == 0 else [0] * int(n.item()), dtype=torch.int64, device=dev)
    if buf.numel():
        torch.distributed.broadcast(buf, src=0)
    return [int(s) for s in buf.tolist()]


def buddy_addr(own: str) -> str | None:
    """The replica server of this node's buddy (`replica.buddy`), from an all-gather of every
    rank's node (torchelastic's GROUP_RANK) and its node's server address; None if there is none."""
    node = int(os.environ.get("GROUP_RANK", "0"))
    raw = own.encode()[:ADDR_BYTES]
    dev = _device()
    mine = torch.zeros(1 + ADDR_BYTES, dtype=torch.int64, device=dev)
    mine[0] = node
    if raw:
        mine[1 : 1 + len(raw)] = torch.tensor(list(raw), dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(every, mine)
    addrs: dict[int, str] = {}
    for row in every:
        values = row.tolist()
        text = bytes(v for v in values[1:] if v).decode(errors="replace")
        if text:
            addrs.setdefault(int(values[0]), text)
    target = replica.buddy(node, [int(row[0].item()) for row in every])
    return addrs.get(target) if target is not None else None


def buddy_secret(own: bytes) -> bytes:
    """The secret of this node's buddy's replica server (b"": none), from an all-gather of every
    rank's node and its node's secret (40 bytes a rank). The addresses go through the store, which
    whoever reaches it can read (`agree.buddy_addr`); the secrets only through the job's collective."""
    node = int(os.environ.get("GROUP_RANK", "0"))
    padded = own[: replica.SECRET_BYTES].ljust(replica.SECRET_BYTES, b"\0")
    words = [int.from_bytes(padded[i : i + 8], "little", signed=True) for i in range(0, replica.SECRET_BYTES, 8)]
    mine = torch.tensor([node, len(own[: replica.SECRET_BYTES]), *words], dtype=torch.int64, device=_device())
    every = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(every, mine)
    found: dict[int, bytes] = {}
    for row in every:
        values = [int(v) for v in row.tolist()]
        raw = b"".join(v.to_bytes(8, "little", signed=True) for v in values[2:])
        found.setdefault(values[0], raw[: values[1]])
    target = replica.buddy(node, [int(row[0].item()) for row in every])
    return found.get(target, b"") if target is not None else b""


def min_over_ranks(value: int) -> int:
    flag = torch.tensor([value], dtype=torch.int64, device=_device())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return int(flag.item())
