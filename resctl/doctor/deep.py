"""--deep benchmarks with torch (imported here only): a bf16 matmul and pinned host<->device
copies on every GPU, and GPU-to-GPU copies between neighbours when there is more than one.

Copies move 1 GiB per repetition and report the median of 5 timed repetitions (after one
warm-up), in decimal GB/s, timed with CUDA events on the copy's stream: the same thing a plain
``pinned.to("cuda", non_blocking=True)`` measures (bench/ compares the two).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

COPY_BYTES = 1 << 30
REPEATS = 5
MATMUL_N = 8192


class Unavailable(Exception):
    """No torch with CUDA here."""


@dataclass(frozen=True)
class GpuBench:
    index: int
    name: str
    tflops: float = 0.0
    h2d_gbps: float = 0.0
    d2h_gbps: float = 0.0
    error: str | None = None


@dataclass(frozen=True)
class PairBench:
    src: int
    dst: int
    gbps: float = 0.0
    error: str | None = None


def _torch() -> Any:
    try:
        import torch
    except ImportError as err:
        raise Unavailable(f"--deep needs torch ({err})") from err
    if not torch.cuda.is_available():
        raise Unavailable("--deep: torch sees no CUDA device")
    return torch


def _timed(torch: Any, fn: Any, repeats: int) -> list[float]:
    """Seconds per call of `fn`, on the current stream, after one warm-up call."""
    fn()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


def copy_gbps(torch: Any, index: int, nbytes: int = COPY_BYTES, repeats: int = REPEATS) -> tuple[float, float]:
    """(host->device, device->host) GB/s on GPU `index` with pinned host memory."""
    with torch.cuda.device(index):
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
        h2d = statistics.median(_timed(torch, lambda: dev.copy_(host, non_blocking=True), repeats))
        d2h = statistics.median(_timed(torch, lambda: host.copy_(dev, non_blocking=True), repeats))
        host = dev = None  # the buffers go now (the lambdas above hold them as closure cells)
    return nbytes / h2d / 1e9, nbytes / d2h / 1e9


def matmul_tflops(torch: Any, index: int, n: int = MATMUL_N, repeats: int = 10) -> float:
    """TFLOP/s of an n x n x n matmul (bf16 where supported); raises on non-finite results."""
    with torch.cuda.device(index):
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        gen = torch.Generator(device=f"cuda:{index}").manual_seed(index)
        a = torch.randn(n, n, device=f"cuda:{index}", dtype=dtype, generator=gen)
        b = torch.randn(n, n, device=f"cuda:{index}", dtype=dtype, generator=gen)
        c = torch.empty_like(a)
        _timed(torch, lambda: torch.matmul(a, b, out=c), 2)  # clocks up
        secs = statistics.median(_timed(torch, lambda: torch.matmul(a, b, out=c), repeats))
        if not bool(torch.isfinite(c).all()):
            raise RuntimeError("matmul produced non-finite values")
        a = b = c = None  # the buffers go now (the lambdas above hold them as closure cells)
    return 2 * n**3 / secs / 1e12


def per_gpu(cancel: threading.Event | None = None) -> list[GpuBench]:
    """Matmul and copy bandwidth of every visible GPU; one GPU's error does not stop the others."""
    torch = _torch()
    out = []
    for i in range(torch.cuda.device_count()):
        if cancel is not None and cancel.is_set():
            break
        name = torch.cuda.get_device_name(i)
        try:
            tflops = matmul_tflops(torch, i)
            h2d, d2h = copy_gbps(torch, i)
            out.append(GpuBench(i, name, tflops, h2d, d2h))
        except Exception as err:  # noqa: BLE001 - a sick GPU raises CUDA errors: that is the finding
            out.append(GpuBench(i, name, error=f"{type(err).__name__}: {err}"))
        finally:
            torch.cuda.empty_cache()
    return out


def peer_to_peer(cancel: threading.Event | None = None, nbytes: int = COPY_BYTES) -> list[PairBench]:
    """GB/s of a device-to-device copy from each GPU to the next (ring order); [] with one GPU."""
    torch = _torch()
    n = torch.cuda.device_count()
    out: list[PairBench] = []
    if n < 2:
        return out
    for i in range(n):
        if cancel is not None and cancel.is_set():
            break
        j = (i + 1) % n
        try:
            src = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{i}")
            dst = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{j}")

            def once(src: Any = src, dst: Any = dst, i: int = i, j: int = j) -> None:
                dst.copy_(src, non_blocking=True)
                torch.cuda.synchronize(i)
                torch.cuda.synchronize(j)

            once()
            times = []
            for _ in range(REPEATS):
                t0 = time.perf_counter()
                once()
                times.append(time.perf_counter() - t0)
            out.append(PairBench(i, j, nbytes / statistics.median(times) / 1e9))
            del src, dst
        except Exception as err:  # noqa: BLE001 - a broken pair raises CUDA errors: that is the finding
            out.append(PairBench(i, j, error=f"{type(err).__name__}: {err}"))
    return out
