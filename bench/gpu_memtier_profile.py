"""Where a memory-tier snapshot and restore spend their time on one GPU (a profile, not a benchmark).

    python bench/gpu_memtier_profile.py --params-m 537        # one H200: 6.44 GB model + Adam

Prints: the device-to-device copy of the state (per-tensor copy_ vs one _foreach_copy_), the parts
of a device-staged `save_memory`, the step times around snapshots in a loop, and a restarted
worker's `load()` split into verify (upload while checksumming), restore and the rest.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_checkpoint import Model  # noqa: E402

from resctl.checkpoint import format as fmt  # noqa: E402
from resctl.checkpoint import memdir  # noqa: E402
from resctl.checkpoint.engine import Checkpointer  # noqa: E402

RUN = "bench-memtier-profile"


def timed(fn, reps: int = 5) -> float:
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def top(pr: cProfile.Profile, n: int = 18) -> str:
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(n)
    return s.getvalue()


def child(params_m: float, ckdir: str) -> None:
    model = Model(params_m, "cuda", batch=64)
    model.opt.state.clear()  # a restarted worker: no optimizer state yet
    ck = Checkpointer(dir=ckdir, interval_steps=10**9, memory_every=1, run_id=RUN, stage="device", exclusive=False)
    tier = ck.memory_tier()
    import resctl.checkpoint.memory as mem
    orig_verify, orig_restore = mem.MemoryTier.verify, mem.MemoryTier.restore
    spent = {}

    def verify(self, *a, **k):
        t = time.perf_counter(); r = orig_verify(self, *a, **k); spent["verify"] = time.perf_counter() - t; return r

    def restore(self, *a, **k):
        t = time.perf_counter(); r = orig_restore(self, *a, **k); spent["restore"] = time.perf_counter() - t; return r

    mem.MemoryTier.verify, mem.MemoryTier.restore = verify, restore
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    t = time.perf_counter()
    pr.enable()
    step = ck.load(model.state())
    torch.cuda.synchronize()
    pr.disable()
    print(f"child load: step {step} in {time.perf_counter() - t:.3f} s; {spent}")
    print(top(pr, 30))
    ck.close()
    del tier


def sweep(params_m: float, ckdir: str) -> None:
    """The upload (restore's verify pass) of one snapshot with other worker counts, chunk sizes,
    with and without populate, and torch's intra-op threads at 1."""
    from concurrent.futures import ThreadPoolExecutor

    import resctl.checkpoint.memory as mem
    from resctl.checkpoint import upload

    model = Model(params_m, "cuda", batch=64)
    ck = Checkpointer(dir=ckdir, interval_steps=10**9, memory_every=1, run_id=RUN + "-sweep", exclusive=False)
    ck.save_memory(model.state(), 1)
    ck.wait()
    tier = ck.memory_tier()
    slot = tier._slots[tier.newest()[1]]
    manifest = slot.manifest()
    devices = [torch.device("cpu") if len(sp.shape) == 0 else torch.device("cuda") for sp in manifest.tensors]
    del model
    torch.cuda.empty_cache()
    for intra in (0, 1):
        if intra:
            torch.set_num_threads(1)
        for threads, chunk_mb, populate in ((8, 32, True), (8, 32, False), (16, 32, True), (16, 16, True),
                                            (12, 64, True), (4, 64, True), (16, 8, True)):
            times = []
            for _ in range(3):
                data = mem._map_snapshot(slot.path / mem.DATA, manifest.stream_bytes)
                with ThreadPoolExecutor(threads) as pool:
                    torch.cuda.synchronize()
                    t = time.perf_counter()
                    crc, outs = upload.upload(mem._bytes_of(data), manifest.tensors, devices, pool=pool, threads=threads, chunk=chunk_mb << 20,
                                              populate=mem._populator(data) if populate else None)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t)
                assert crc == manifest.files[mem.DATA].crc32
                del outs
                torch.cuda.empty_cache()
                data.close()
            print(f"upload threads={threads:2d} chunk={chunk_mb:2d}MB populate={populate!s:5} torch_threads="
                  f"{torch.get_num_threads():2d}: median {statistics.median(times):.3f} s  {times}", flush=True)
    ck.release_memory()
    ck.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params-m", type=float, default=537)
    ap.add_argument("--dir", default="/var/tmp/resctl-memtier-profile")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--sweep", action="store_true")
    args = ap.parse_args()
    if args.child:
        return child(args.params_m, args.dir)
    if args.sweep:
        return sweep(args.params_m, args.dir)
    memdir.release_job(RUN)
    model = Model(args.params_m, "cuda", batch=64)
    tensors = model.tensors()
    specs, total = fmt.plan_stream(tensors)
    arena = torch.empty(total, dtype=torch.uint8, device="cuda")
    views = [arena.narrow(0, s.offset, s.nbytes).view(t.dtype).view(t.shape) for t, s in zip(tensors, specs)]

    def loop_copy():
        for v, t in zip(views, tensors):
            v.copy_(t)

    print(f"state {total / 1e9:.2f} GB, {len(tensors)} tensors")
    print(f"d2d per-tensor copy_: {timed(loop_copy) * 1e3:.2f} ms")
    print(f"d2d _foreach_copy_:   {timed(lambda: torch._foreach_copy_(views, tensors)) * 1e3:.2f} ms")
    flat = torch.empty(total // 4, dtype=torch.float32, device="cuda")
    print(f"one flat copy (same bytes): {timed(lambda: flat.copy_(arena.view(torch.float32)[: total // 4])) * 1e3:.2f} ms")
    print(f"one Adam step: {timed(model.step) * 1e3:.2f} ms")
    arena = views = flat = None  # freed now (the lambdas above hold them as closure cells)

    ck = Checkpointer(dir=args.dir, interval_steps=10**9, memory_every=1, run_id=RUN, stage="device", exclusive=False)
    state = model.state()
    for s in range(3):
        ck.save_memory(state, s)
        ck.wait()
    pr = cProfile.Profile()
    blocked = []
    for s in range(3, 8):
        torch.cuda.synchronize()
        t = time.perf_counter()
        pr.enable()
        ck.save_memory(state, s)
        pr.disable()
        blocked.append(time.perf_counter() - t)
        ck.wait()
    print("save_memory blocked (ms):", [round(b * 1e3, 2) for b in blocked])
    print(top(pr))

    # Step times around snapshots (memory_every = 40), the background commit running.
    times = []
    ck.memory_every = 40
    for s in range(8, 8 + 120):
        torch.cuda.synchronize()
        t = time.perf_counter()
        model.step()
        ck.maybe_save(state, s)
        torch.cuda.synchronize()
        times.append((s, time.perf_counter() - t))
    med = statistics.median(x for _, x in times)
    print(f"loop: median step+save {med * 1e3:.2f} ms; slow steps:",
          [(s, round(x * 1e3, 1)) for s, x in times if x > 1.3 * med])
    ck.wait()
    ck.close()
    proc = subprocess.run([sys.executable, __file__, "--child", "--params-m", str(args.params_m), "--dir", args.dir],
                          capture_output=True, text=True, timeout=300)
    print(proc.stdout[-8000:], proc.stderr[-3000:])
    memdir.release_job(RUN)


if __name__ == "__main__":
    main()
