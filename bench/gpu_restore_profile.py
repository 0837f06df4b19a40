"""Where a memory-tier restore's upload spends its time, stage by stage, on one GPU (issue 26).

    python bench/gpu_restore_profile.py --gb 6.44 --tensors 256 --json out.json

A restarted worker restores its snapshot from a file in /dev/shm: the file's pages are in memory
(tmpfs) but not mapped in the new process. This script lays such a file out once, then times, each
in a fresh mapping or file descriptor, what the restore's one pass (`resctl.checkpoint.upload`) is
made of, so the bound can be named:

- the physical limit: pinned host-to-device bandwidth (one stream and 8 streams), bytes / bandwidth;
- allocations a new process pays: the device tensors (cudaMalloc) and the pinned bounce buffers;
- the host side alone: mmap + copy into pinned buffers (what `upload` does), the same + CRC32C, and
  `preadv` into the pinned buffers + CRC32C (no page faults on the source);
- the whole pass: `upload.upload` as the restore calls it, and the same with `preadv` reads.

Each variant runs with 8 and 16 workers. Prints one line per measure, and a JSON document.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from resctl.checkpoint import format as fmt
from resctl.checkpoint import upload
from resctl.checkpoint.crc import checksum

PATH = Path("/dev/shm/resctl-bench-restore-profile.bin")
PIN = torch.cuda.is_available()  # the host passes also run on a CPU-only box (small sizes, to check the script)


def lay_out(total: int, tensors: int) -> list[fmt.TensorSpec]:
    each = fmt.align(total // tensors)
    specs = [fmt.TensorSpec(i * each, each, "uint8", (each,)) for i in range(tensors)]
    block = os.urandom(64 << 20)
    with open(PATH, "wb") as f:
        left = each * tensors
        while left > 0:
            f.write(block[: min(left, len(block))])
            left -= len(block)
    return specs


def timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return out


def h2d_bandwidth(streams: int, size: int = 256 << 20, reps: int = 8) -> float:
    srcs = [torch.empty(size, dtype=torch.uint8, pin_memory=True) for _ in range(streams)]
    dsts = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(streams)]
    ss = [torch.cuda.Stream() for _ in range(streams)]

    def run() -> None:
        for _ in range(reps):
            for s, a, b in zip(ss, srcs, dsts):
                with torch.cuda.stream(s):
                    b.copy_(a, non_blocking=True)

    run()
    t = min(timed(run, 3))
    return streams * size * reps / t


def host_pass(total: int, threads: int, chunk: int, mode: str) -> float:
    """mode: 'copy' (mmap -> pinned), 'copy+crc', 'pread+crc'."""
    chunks = [(lo, min(total, lo + chunk)) for lo in range(0, total, chunk)]
    fd = os.open(PATH, os.O_RDONLY)
    mm = mmap.mmap(fd, total, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) if mode != "pread+crc" else None
    src = torch.frombuffer(mm, dtype=torch.uint8) if mm is not None else None
    bufs = [torch.empty(chunk, dtype=torch.uint8, pin_memory=PIN) for _ in range(threads)]
    views = [fmt.byte_view(b) for b in bufs]

    def work(part: int) -> None:
        buf, view = bufs[part], views[part]
        for ci in range(part, len(chunks), threads):
            lo, hi = chunks[ci]
            if src is not None:
                buf.narrow(0, 0, hi - lo).copy_(src.narrow(0, lo, hi - lo))
            else:
                os.preadv(fd, [view[: hi - lo]], lo)
            if mode != "copy":
                checksum(view[: hi - lo])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(work, range(threads)))
    took = time.perf_counter() - t0
    src = None  # the view goes before the mapping closes (work() holds it as a closure cell)
    if mm is not None:
        mm.close()
    os.close(fd)
    return took


def full_upload(specs: list[fmt.TensorSpec], total: int, threads: int, pread: bool) -> float:
    fd = os.open(PATH, os.O_RDONLY)
    mm = mmap.mmap(fd, total, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    src = torch.frombuffer(mm, dtype=torch.uint8)
    devices = [torch.device("cuda")] * len(specs)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        if pread:
            upload_pread(fd, total, specs, devices, pool, threads)
        else:
            upload.upload(src, specs, devices, pool=pool, threads=threads)
        torch.cuda.synchronize()
    took = time.perf_counter() - t0
    del src
    mm.close()
    os.close(fd)
    return took


def upload_pread(fd: int, total: int, specs, devices, pool, threads: int, chunk: int = upload.CHUNK) -> None:
    """`upload.upload` with `preadv` into the pinned bounce buffers instead of a copy out of a mapping."""
    outs = [torch.empty(s.shape, dtype=fmt.dtype_from_name(s.dtype), device=d) for s, d in zip(specs, devices)]
    flats = [t.reshape(-1).view(torch.uint8) for t in outs]
    starts = [s.offset for s in specs]
    chunks = [(lo, min(total, lo + chunk)) for lo in range(0, total, chunk)]
    plans = [[(flats[p.index], p.dst, p.src - lo, p.nbytes) for p in upload.pieces(specs, lo, hi, starts)]
             for lo, hi in chunks]

    def work(part: int) -> None:
        with upload._Bounce(torch.device("cuda"), chunk) as bounce:
            for n, ci in enumerate(range(part, len(chunks), threads)):
                lo, hi = chunks[ci]
                k = n % 2
                buf, view = bounce.take(k)
                os.preadv(fd, [view[: hi - lo]], lo)
                checksum(view[: hi - lo])
                for dst, at, off, nbytes in plans[ci]:
                    dst.narrow(0, at, nbytes).copy_(buf.narrow(0, off, nbytes), non_blocking=True)
                bounce.sent(k)

    list(pool.map(work, range(threads)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gb", type=float, default=6.44)
    p.add_argument("--tensors", type=int, default=256)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--cold-only", action="store_true", help="only the passes in fresh processes")
    a = p.parse_args()
    total_req = int(a.gb * 1e9)
    specs = lay_out(total_req, a.tensors)
    total = specs[-1].offset + specs[-1].nbytes
    out: dict[str, object] = {"bytes": total, "tensors": a.tensors, "device": torch.cuda.get_device_name(0),
                              "torch": torch.__version__, "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    def say(key: str, value: object) -> None:
        out[key] = value
        print(f"{key}: {value}", flush=True)

    if a.cold_only:
        for variant, median in cold(["chunk32", "chunk16", "chunk8", "register"], total, a.tensors, a.reps).items():
            say(f"cold pass in a fresh process, {variant} (median s)", median)
        PATH.unlink()
        return
    t0 = time.perf_counter()
    first = [torch.empty(s.shape, dtype=torch.uint8, device="cuda") for s in specs]
    torch.cuda.synchronize()
    say("alloc device tensors, first in process (s)", round(time.perf_counter() - t0, 4))
    del first
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    pinned = [torch.empty(upload.CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(16)]
    say("alloc 16 pinned 32 MB bounce buffers (s)", round(time.perf_counter() - t0, 4))
    del pinned
    for n in (1, 8):
        bw = h2d_bandwidth(n)
        say(f"H2D pinned bandwidth, {n} stream(s) (GB/s)", round(bw / 1e9, 1))
        say(f"physical limit at {n} stream(s): bytes / bandwidth (s)", round(total / bw, 4))
    for threads in (8, 16):
        for mode in ("copy", "copy+crc", "pread+crc"):
            ts = [host_pass(total, threads, upload.CHUNK, mode) for _ in range(a.reps)]
            say(f"host {mode}, {threads} workers (median s)", round(statistics.median(ts), 4))
        for pread in (False, True):
            ts = [full_upload(specs, total, threads, pread) for _ in range(a.reps)]
            say(f"whole pass ({'preadv' if pread else 'mmap copy, as shipped'}), {threads} workers (median s)",
                round(statistics.median(ts), 4))
    for variant, median in cold(["chunk32", "chunk16", "chunk8", "register"], total, a.tensors, a.reps).items():
        say(f"cold pass in a fresh process, {variant} (median s)", median)
    PATH.unlink()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))



# --- cold passes: each in a fresh process, as a restarted worker pays them ------------------------

COLD = r'''
import mmap, os, sys, time, json, torch
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, sys.argv[1])
from resctl.checkpoint import format as fmt, upload
from resctl.checkpoint.crc import checksum
variant, total, tensors = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
each = total // tensors
specs = [fmt.TensorSpec(i * each, each, "uint8", (each,)) for i in range(tensors)]
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()   # the context exists before load()
fd = os.open(sys.argv[5], os.O_RDWR)
mm = mmap.mmap(fd, total, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
src = torch.frombuffer(mm, dtype=torch.uint8)
t0 = time.perf_counter()
pool = ThreadPoolExecutor(8)
if variant.startswith("chunk"):
    upload.upload(src, specs, [torch.device("cuda")] * tensors, pool=pool, threads=8, chunk=int(variant[5:]) << 20)
elif variant == "register":
    cudart = torch.cuda.cudart()
    outs = [torch.empty(s.shape, dtype=torch.uint8, device="cuda") for s in specs]
    base = src.data_ptr()
    step = 64 << 20
    ranges = [(lo, min(total, lo + step)) for lo in range(0, total, step)]
    def work(part):
        s = torch.cuda.Stream()
        crcs = []
        with torch.cuda.stream(s):
            for lo, hi in ranges[part::8]:
                assert int(cudart.cudaHostRegister(base + lo, hi - lo, 0)) == 0
                crcs.append((lo, checksum(memoryview(mm)[lo:hi])))
                for p in upload.pieces(specs, lo, hi):
                    outs[p.index].narrow(0, p.dst, p.nbytes).copy_(src.narrow(0, p.src, p.nbytes), non_blocking=True)
        s.synchronize()
        for lo, hi in ranges[part::8]:
            cudart.cudaHostUnregister(base + lo)
        return crcs
    list(pool.map(work, range(8)))
torch.cuda.synchronize()
print(json.dumps({"variant": variant, "s": time.perf_counter() - t0}))
'''


def cold(variants: list[str], total: int, tensors: int, reps: int) -> dict[str, float]:
    import subprocess

    root = str(Path(__file__).resolve().parent.parent)
    found: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(reps):
        for v in variants:  # alternating
            done = subprocess.run([sys.executable, "-c", COLD, root, v, str(total), str(tensors), str(PATH)],
                                  capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                print(v, "failed:", done.stderr[-800:], flush=True)
                continue
            found[v].append(json.loads(done.stdout.strip().splitlines()[-1])["s"])
    return {v: round(statistics.median(ts), 4) for v, ts in found.items() if ts}


if __name__ == "__main__":
    main()
