"""Why a forked worker's tiny CUDA step is slower than a fresh process's (issue 43, item 2): the same step loop
(one-rank DDP over NCCL, `Linear(32, 32)`, SGD, as bench/scripts/step_phases.py) in a fresh interpreter and in
children forked from interpreters that imported more or less, with and without what a child could do first.
No launcher: each variant is one process tree started here, the variants alternating, `--repeats` times.

    python bench/fork_step_variants.py --repeats 3 --steps 4000
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import hwcount  # bench/scripts/hwcount.py

VARIANTS = {
    "fresh": ("light", None),            # the loop in the interpreter that imported torch (torchrun's worker)
    "fork": ("light", None),             # forked from an interpreter that imported torch
    "fork_heavy": ("heavy", None),       # forked from one that imported what resctl's launcher has at a fork
    "fork_heavy_freeze": ("heavy", "freeze"),  # ... and froze the collector's objects first (resctl's at-fork hook)
    "fork_heavy_trim": ("heavy", "trim"),      # ... and gave malloc's free memory back first (malloc_trim)
    "fork_heavy_thread": ("heavy_thread", None),  # the heavy imports in a thread (as the launcher's late preload)
    "fork_dynamo": ("dynamo", None),     # forked after importing torch._dynamo only (of the heavy set)
    "fork_fsdp": ("fsdp", None),         # ... torch.distributed.fsdp only
    "fork_nvrx": ("nvrx", None),         # ... NVRx's fault tolerance and resctl's shim only
    "fork_nvml": ("nvml", None),         # forked from one that imported torch and initialised NVML (as NVRx's monitor)
    "fork_threads": ("threads", None),   # forked from one whose other threads had allocated (a launcher has several)
}


def imports(kind: str) -> None:
    import torch
    import torch.distributed
    from torch.nn.parallel import DistributedDataParallel  # noqa: F401

    if kind == "nvml":
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - no NVML here: the variant is the plain fork
            print(f"no NVML: {e}", file=sys.stderr)
    if kind == "threads":
        import threading

        def churn() -> None:
            junk = [bytearray(n % 4096 + 16) for n in range(200_000)]
            del junk[::2]

        workers = [threading.Thread(target=churn) for _ in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    if kind == "dynamo":
        import torch._dynamo
    if kind == "fsdp":
        import torch.distributed.fsdp
    if kind == "nvrx":
        import nvidia_resiliency_ext.fault_tolerance

        import resctl.shim.runtime
    if kind == "heavy_thread":
        import threading

        t = threading.Thread(target=imports, args=("heavy",))
        t.start()
        t.join()
    if kind == "heavy":
        import torch._dynamo
        import torch.distributed.fsdp  # noqa: F401

        try:
            import nvidia_resiliency_ext.fault_tolerance  # noqa: F401

            import resctl.shim.runtime  # noqa: F401
        except ImportError:
            pass


def loop(steps: int, store_dir: str) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    counters = hwcount.Counters()  # before CUDA's, NCCL's and autograd's threads start
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(0)
    store = dist.FileStore(os.path.join(store_dir, f"s{os.getpid()}"), 1)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
    model = DDP(torch.nn.Linear(32, 32).to(device), device_ids=[0] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 32, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    times = []
    for i in range(200 + steps):
        if i == 200:
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            proc0, ru0, hw0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF), counters.read()
        t0 = time.perf_counter_ns()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        sync()
        times.append(time.perf_counter_ns() - t0)
    wall = time.perf_counter() - wall0
    main, proc = time.thread_time() - cpu0, time.process_time() - proc0
    ru, hw = resource.getrusage(resource.RUSAGE_SELF), hwcount.Counters.diff(hw0, counters.read(), per=steps)
    per_step = {k: round((getattr(ru, f"ru_{k}") - getattr(ru0, f"ru_{k}")) / steps, 3)
                for k in ("minflt", "majflt", "nvcsw", "nivcsw")}  # page faults and context switches a step
    dist.destroy_process_group()
    return {"step_us": round(statistics.median(times[200:]) / 1e3, 1),
            "main_cpu_us": round(main / steps * 1e6, 1), "other_cpu_us": round((proc - main) / steps * 1e6, 1),
            "wall_us": round(wall / steps * 1e6, 1), **per_step, "hw": hw, "hw_error": counters.error,
            "pid": os.getpid()}  # the process that ran the loop (bench/fork_step_cachegrind.py reads its counts)


def run_variant(name: str, steps: int, store_dir: str) -> dict:
    kind, first = VARIANTS[name]
    imports(kind)
    if name == "fresh":
        return loop(steps, store_dir)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 1
        try:
            if first == "freeze":
                gc.freeze()
            elif first == "trim":
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            os.write(w, json.dumps(loop(steps, store_dir)).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.waitpid(pid, 0)
    return json.loads(data)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child run: this variant, print its JSON
    ap.add_argument("--store-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print("RESULT " + json.dumps(run_variant(a.one, a.steps, a.store_dir)), flush=True)
        return
    names = a.variants.split(",")
    got: dict[str, list[dict]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.repeats):
            for n in (names if i % 2 == 0 else names[::-1]):
                out = subprocess.run([sys.executable, __file__, "--one", n, "--steps", str(a.steps), "--store-dir", d],
                                     capture_output=True, text=True, timeout=300)
                line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
                got[n].append(json.loads(line[7:]) if line else {"error": out.stderr[-800:]})
                print(f"{n}: {got[n][-1]}", file=sys.stderr, flush=True)
    summary = {n: {k: statistics.median(r[k] for r in rs if k in r) for k in ("step_us", "main_cpu_us", "other_cpu_us", "minflt", "nvcsw", "nivcsw")}
               for n, rs in got.items() if any("step_us" in r for r in rs)}
    for n, row in summary.items():
        hws = [r["hw"] for r in got[n] if r.get("hw")]
        row["hw"] = {k: statistics.median(h[k] for h in hws) for k in hws[0]} if hws else None
    print(json.dumps({"summary": summary, "runs": got}, indent=1))


if __name__ == "__main__":
    main()
