"""A memory snapshot's stream checksummed and copied into new tensors in one pass.

A restarted worker on a GPU restores its snapshot from host shared memory. A copy out of that
pageable mapping runs at a fraction of the host-to-device link's speed, and checksumming the
mapping first reads every byte twice. `upload` does both at once: `threads` workers each take every
`threads`-th `chunk` of the stream (pages fault in as it is read: faster here than MADV_POPULATE_READ
first, measured on the H200 host), copy it into one of two pinned bounce
buffers, checksum it there, and send the pieces that belong to tensors on to their destinations (on
the worker's own CUDA stream) while the next chunk is read. The destinations are new tensors, so the
caller's state is untouched until it has compared the checksum (`memory.MemoryTier.verify`).

The planning (`pieces`) is pure; `upload` also runs with CPU destinations only (no CUDA), which is
how the tests check it here.
"""

from __future__ import annotations

import bisect
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from resctl.checkpoint import format as fmt
from resctl.checkpoint.crc import checksum, combine

# Bytes per bounce buffer: 2 per worker, pinned when any destination is on CUDA. A restarted worker
# allocates them cold, and pinning costs more than the pass gains from big chunks: one H200 host,
# 6.44 GB, 8 workers, each pass in a fresh process (bench/gpu_restore_profile.py --cold-only):
# 32 MB 0.587 s, 16 MB 0.426 s, 8 MB 0.346 s (in a warm process 32 MB was the fastest).
CHUNK = 8 << 20


@dataclass(frozen=True)
class Piece:
    """Bytes [src, src + nbytes) of the stream go to bytes [dst, dst + nbytes) of tensor `index`."""

    index: int
    dst: int
    src: int
    nbytes: int


def pieces(specs: Sequence[fmt.TensorSpec], lo: int, hi: int, starts: Sequence[int] | None = None) -> list[Piece]:
    """The parts of the stream range [lo, hi) that belong to tensors (padding belongs to none).
    `starts`: the specs' offsets (sorted, as `plan_stream` lays them out), precomputed by the caller."""
    starts = [s.offset for s in specs] if starts is None else starts
    out: list[Piece] = []
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    while i < len(specs) and specs[i].offset < hi:
        spec = specs[i]
        a, b = max(lo, spec.offset), min(hi, spec.offset + spec.nbytes)
        if b > a:
            out.append(Piece(i, a - spec.offset, a, b - a))
        i += 1
    return out


def _present(t: torch.Tensor | None) -> torch.Tensor:
    assert t is not None  # a piece belongs to a tensor with bytes
    return t


def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)


def upload(src: torch.Tensor, specs: Sequence[fmt.TensorSpec], devices: Sequence[torch.device], *,
           pool: ThreadPoolExecutor | None = None, threads: int = 1, chunk: int = CHUNK) -> tuple[int, list[torch.Tensor]]:
    """Checksum the whole of `src` (a CPU uint8 stream) and copy each spec's bytes into a new tensor
    on `devices[i]`; return (checksum, tensors). Work runs on `pool` (`threads` parts; inline when
    no pool). Returns once every copy has completed."""
    total = src.numel()
    outs = [torch.empty(s.shape, dtype=fmt.dtype_from_name(s.dtype), device=d) for s, d in zip(specs, devices)]
    if total == 0:
        return checksum(b""), outs
    flats = [_flat_bytes(t) if t.numel() else None for t in outs]
    starts = [s.offset for s in specs]
    cuda = next((d for d in devices if d.type == "cuda"), None)
    chunks = [(lo, min(total, lo + chunk)) for lo in range(0, total, chunk)]
    # Planned up front: the workers' Python per chunk is as short as it can be (they share the GIL).
    plans = [[(_present(flats[p.index]), p.dst, p.src - lo, p.nbytes) for p in pieces(specs, lo, hi, starts)]
             for lo, hi in chunks]
    parts = max(1, min(threads, len(chunks))) if pool is not None else 1

    def work(part: int) -> list[tuple[int, int]]:
        crcs = []
        with _Bounce(cuda, min(chunk, total)) as bounce:
            for n, ci in enumerate(range(part, len(chunks), parts)):
                lo, hi = chunks[ci]
                k = n % 2
                buf, view = bounce.take(k)
                buf = buf.narrow(0, 0, hi - lo)
                buf.copy_(src.narrow(0, lo, hi - lo))
                crcs.append((lo, checksum(view[: hi - lo])))
                for dst, at, off, nbytes in plans[ci]:
                    dst.narrow(0, at, nbytes).copy_(buf.narrow(0, off, nbytes), non_blocking=True)
                bounce.sent(k)
        return crcs

    if pool is None or parts == 1:
        found = work(0)
    else:
        found = [c for got in pool.map(work, range(parts)) for c in got]
    crc = None
    for (lo, hi), (at, part_crc) in zip(chunks, sorted(found)):
        assert lo == at
        crc = part_crc if crc is None else combine(crc, part_crc, hi - lo)
    assert crc is not None
    return crc, outs


class _Bounce:
    """Two bounce buffers of one worker; with a CUDA destination they are pinned, the worker's
    copies run on its own stream (current for the whole `with`), and a buffer is refilled only
    after the copies out of it completed (an event per buffer)."""

    def __init__(self, device: torch.device | None, size: int) -> None:
        pinned = device is not None
        self.bufs = [torch.empty(size, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        self.views = [fmt.byte_view(b) for b in self.bufs]
        self.stream = torch.cuda.Stream(device) if device is not None else None
        self.events = [torch.cuda.Event() for _ in range(2)] if device is not None else []
        self.used = [False, False]
        self._ctx: contextlib.AbstractContextManager[object] = (
            torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext())

    def __enter__(self) -> _Bounce:
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._ctx.__exit__(*exc)
        if self.stream is not None:
            self.stream.synchronize()

    def take(self, k: int) -> tuple[torch.Tensor, memoryview]:
        if self.used[k] and self.events:
            self.events[k].synchronize()
        return self.bufs[k], self.views[k]

    def sent(self, k: int) -> None:
        self.used[k] = True
        if self.stream is not None:
            self.events[k].record(self.stream)
