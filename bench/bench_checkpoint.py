"""Benchmark resctl.checkpoint against its limits, side by side in one run.

Measures, on the same state and the same directory:

- blocked:   seconds `save()` holds the training loop with async on (median), next to the
             staging-copy limit: one copy of the same tensors into a preallocated buffer
             (pinned on CUDA) — async cannot block for less than that.
- persist:   bytes / seconds from staged to durable for the async engine, next to `torch.save`
             + fsync of the same (CPU) tensors, and next to a plain multi-writer write + fsync of
             the same number of bytes with `--writers` threads (the disk's bandwidth to beat).

Example::

    python bench/bench_checkpoint.py --size-gb 0.5 --device cpu --writers 4 --repeats 3 --dir /tmp/bench-ck

Prints one JSON document on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resctl.checkpoint.engine import Checkpointer  # noqa: E402
from resctl.telemetry.events import EventLog  # noqa: E402


class MemoryLog(EventLog):
    """An EventLog that keeps records in memory."""

    def __init__(self) -> None:
        super().__init__(None, rank=0)
        self.records: list[dict[str, Any]] = []

    def emit(self, kind: str, **fields: Any) -> None:
        self.records.append({"kind": kind, **fields})


def make_state(size_gb: float, device: str) -> dict[str, torch.Tensor]:
    """Tensors shaped like a model's: a few large ones, many medium, some tiny, ~size_gb in all."""
    total = int(size_gb * (1 << 30))
    sizes: list[int] = []
    pattern = [64 << 20, 16 << 20, 16 << 20, 4 << 20, 4 << 20, 4 << 20, 1 << 20, 4 << 10]
    i = 0
    while sum(sizes) < total:
        sizes.append(min(pattern[i % len(pattern)], total - sum(sizes)))
        i += 1
    g = torch.Generator().manual_seed(0)
    return {f"t{i}": torch.rand(max(n // 4, 1), generator=g).to(device) for i, n in enumerate(sizes)}


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def staging_limit(state: dict[str, torch.Tensor], repeats: int) -> float:
    on_cuda = any(t.is_cuda for t in state.values())
    bufs = {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=on_cuda) for k, t in state.items()}
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for k, t in state.items():
            bufs[k].copy_(t, non_blocking=on_cuda)
        if on_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def engine(state: dict[str, torch.Tensor], root: Path, writers: int, repeats: int) -> tuple[list[float], list[float]]:
    log = MemoryLog()
    ck = Checkpointer(dir=root, async_=True, writers=writers, keep_last=1, rank=0, world_size=1, events=log)
    blocked = []
    for step in range(1, repeats + 2):
        t0 = time.perf_counter()
        ck.save(state, step)  # type: ignore[arg-type]
        blocked.append(time.perf_counter() - t0)
        ck.wait()  # so the next save's blocked time is not waiting for this one
    ck.close()
    persist = [r["seconds"] for r in log.records if r["kind"] == "ckpt_persist"]
    return blocked[1:], persist[1:]  # the first save allocates the arena: reported separately


def torch_save(state: dict[str, torch.Tensor], root: Path, repeats: int) -> list[float]:
    cpu = {k: t.cpu() for k, t in state.items()}
    times = []
    for i in range(repeats):
        path = root / f"torch-save-{i}.pt"
        t0 = time.perf_counter()
        with open(path, "wb") as fh:
            torch.save(cpu, fh)
            fh.flush()
            os.fsync(fh.fileno())
        times.append(time.perf_counter() - t0)
        path.unlink()
    return times


def plain_multiwriter(total: int, root: Path, writers: int, repeats: int) -> list[float]:
    buf = memoryview(os.urandom(min(total, 64 << 20)))
    share = total // writers

    def write(path: Path, n: int) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            left = n
            while left:
                left -= os.write(fd, buf[: min(left, len(buf))])
            os.fsync(fd)
        finally:
            os.close(fd)

    times = []
    for i in range(repeats):
        paths = [root / f"plain-{i}-{w}.bin" for w in range(writers)]
        threads = [threading.Thread(target=write, args=(p, share + (total - share * writers if w == 0 else 0)))
                   for w, p in enumerate(paths)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        times.append(time.perf_counter() - t0)
        for p in paths:
            p.unlink()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--writers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default="bench-checkpoints", help="directory on the disk to measure (removed after)")
    args = ap.parse_args()

    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    try:
        state = make_state(args.size_gb, args.device)
        total = nbytes(state)
        print(f"state: {len(state)} tensors, {total / 1e9:.3f} GB on {args.device}", file=sys.stderr)
        stage = staging_limit(state, args.repeats)
        print(f"staging copy: {stage:.3f} s", file=sys.stderr)
        blocked, persist = engine(state, root / "engine", args.writers, args.repeats)
        print(f"engine: blocked {blocked}, persist {persist}", file=sys.stderr)
        ts = torch_save(state, root, args.repeats)
        print(f"torch.save+fsync: {ts}", file=sys.stderr)
        mw = plain_multiwriter(total, root, args.writers, args.repeats)
        print(f"plain {args.writers}-writer write+fsync: {mw}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    gbps = lambda s: round(total / s / 1e9, 3)  # noqa: E731
    med = statistics.median
    summary = {
        "bytes": total,
        "device": args.device,
        "writers": args.writers,
        "repeats": args.repeats,
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "date": time.strftime("%Y-%m-%d"),
        "blocked_s_median": round(med(blocked), 4),
        "staging_copy_s_median": round(stage, 4),
        "blocked_over_staging": round(med(blocked) / stage, 2),
        "persist_s_median": round(med(persist), 4),
        "persist_gbps": gbps(med(persist)),
        "torch_save_gbps": gbps(med(ts)),
        "plain_multiwriter_gbps": gbps(med(mw)),
        "persist_over_multiwriter": round(med(mw) / med(persist), 3),
        "torch_save_over_multiwriter": round(med(mw) / med(ts), 3),
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
