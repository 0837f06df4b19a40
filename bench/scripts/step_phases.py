"""Where a tiny DDP step's time goes, in the worker (bench/gpu_step_profile.py, issue 31 item 2).

The loop of bench/scripts/happy_ddp.py, timed per phase (perf_counter_ns: zero_grad, forward,
backward, optimizer step, device sync) in alternating blocks: `as_is`; `no_opt_hooks` (the global
optimizer post hooks, resctl's shim among them, removed for the block); `no_gc` (the cyclic GC off).
Rank 0 prints one `PHASES <json>` line: per block kind the median of each phase and of the step,
and what the process inherited (threads, CPU affinity, nice, autogroup, GC generations, hugepages,
torch's thread pools, NCCL/TORCH/CUDA/OMP variables); and per block (`timeline`) when it ran (seconds since the
process started), its median step, and who had the CPU meanwhile, as shares of the block's wall time: this
thread, the process's other threads, the parent (the launcher) and the whole host (busy cores), so a slow block
says whether the worker waited for its own GIL, shared a core, or the launcher was busy beside it.

    torchrun --nproc-per-node 1 bench/scripts/step_phases.py --device cuda --blocks 12 --steps 200
"""

import argparse
import gc
import json
import os
import random
import resource
import statistics
import threading
import time

import hwcount  # bench/scripts/hwcount.py, beside this script (no resctl, no bench package: the user's script)
import torch
import torch.distributed as dist
import torch.optim.optimizer as optimizer_mod
from torch.nn.parallel import DistributedDataParallel as DDP

PHASES = ("zero_grad", "forward", "backward", "opt_step", "sync", "step")


def facts() -> dict:
    def read(path: str) -> str:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return ""

    huge = [line for line in read("/proc/self/smaps_rollup").splitlines() if "AnonHugePages" in line or line.startswith("Rss")]
    return {
        "threads": sorted(t.name for t in threading.enumerate()), "os_threads": len(os.listdir("/proc/self/task")),
        "affinity": len(os.sched_getaffinity(0)), "nice": os.nice(0), "autogroup": read("/proc/self/autogroup").strip(),
        "gc_counts": gc.get_count(), "gc_objects": len(gc.get_objects()), "gc_stats": gc.get_stats(),
        "torch_threads": torch.get_num_threads(), "interop": torch.get_num_interop_threads(), "smaps": huge,
        "opt_post_hooks": len(optimizer_mod._global_optimizer_post_hooks),
        "opt_pre_hooks": len(optimizer_mod._global_optimizer_pre_hooks),
        "module_hooks": len(torch.nn.modules.module._global_forward_pre_hooks) + len(torch.nn.modules.module._global_forward_hooks),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL", "TORCH", "CUDA", "OMP", "PYTORCH", "MALLOC", "LD_"))},
        "switch_interval": __import__("sys").getswitchinterval(), **_modes(), **_kernel_state(read),
    }


#: /proc/self/status lines a fork keeps and an exec may clear, that slow every thread of a process alike
#: (speculation mitigations, seccomp), or say how big its inherited address space is.
STATUS_KEYS = ("Speculation_Store_Bypass", "SpeculationIndirectBranch", "Seccomp", "Seccomp_filters", "NoNewPrivs",
               "THP_enabled", "Cpus_allowed_list", "Mems_allowed_list", "VmRSS", "VmPTE", "RssAnon", "RssFile")


def _kernel_state(read) -> dict:
    """The kernel's view of this process: mitigations, limits on it, its mappings and its threads by name."""
    status = dict(line.split(":", 1) for line in read("/proc/self/status").splitlines() if ":" in line)
    return {"status": {k: status[k].strip() for k in STATUS_KEYS if k in status},
            "vmas": len(read("/proc/self/maps").splitlines()), "timerslack_ns": read("/proc/self/timerslack_ns").strip(),
            "thread_names": hwcount.thread_names()}


def _modes() -> dict:
    """What a forked process could inherit that changes every op's path: tracing and profiling hooks, torch's
    thread-local modes and dispatch keys (autograd's thread takes the caller's), the GC's thresholds."""
    import sys

    def get(f, *a):
        try:
            return repr(f(*a))
        except Exception as e:  # noqa: BLE001 - a name this torch lacks: say so
            return f"n/a ({type(e).__name__})"

    c = torch._C
    return {"profile": repr(sys.getprofile()), "trace": repr(sys.gettrace()),
            "monitoring": [get(sys.monitoring.get_tool, i) for i in range(6)] if hasattr(sys, "monitoring") else None,
            "gc_threshold": gc.get_threshold(), "grad": torch.is_grad_enabled(),
            "inference": get(torch.is_inference_mode_enabled), "anomaly": get(torch.is_anomaly_enabled),
            "autocast": get(torch.is_autocast_enabled), "fn_modes": get(c._len_torch_function_stack),
            "dispatch_modes": get(c._len_torch_dispatch_stack), "fn_enabled": get(c._is_torch_function_enabled),
            "tls_include": get(c._dispatch_tls_local_include_set), "tls_exclude": get(c._dispatch_tls_local_exclude_set),
            "profiler": get(c._autograd._profiler_enabled), "deterministic": get(torch.are_deterministic_algorithms_enabled),
            "matmul_precision": get(torch.get_float32_matmul_precision)}


TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: str) -> float:
    """CPU seconds (user + system) of a process (all its threads), 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def _host_busy() -> float:
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:]]
    return (sum(cpu) - cpu[3] - cpu[4]) / TICK  # all but idle and iowait


def _started_ago() -> float:
    with open("/proc/self/stat") as f:
        start = int(f.read().rsplit(")", 1)[1].split()[19]) / TICK
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - start


class Shares:
    """Who had the CPU during one block: this thread, the rest of this process, the parent, the host."""

    def __init__(self) -> None:
        self.parent = str(os.getppid())
        self.t0 = self._read()

    def _read(self) -> tuple[float, ...]:
        return (time.perf_counter(), time.thread_time(), _proc_cpu("self"), _proc_cpu(self.parent), _host_busy())

    def done(self) -> dict:
        t1 = self._read()
        wall, me, proc, parent, host = (b - a for a, b in zip(self.t0, t1))
        wall = max(wall, 1e-9)
        return {"main": round(me / wall, 3), "other_threads": round(max(proc - me, 0.0) / wall, 3),
                "parent": round(parent / wall, 3), "host_busy": round(host / wall, 2)}


def _thread_cpu(prefix: str) -> float:
    """CPU seconds so far of this process's Python threads whose name starts with `prefix`."""
    total = 0.0
    for t in threading.enumerate():
        if t.name.startswith(prefix) and t.native_id is not None:
            total += _proc_cpu(f"self/task/{t.native_id}")
    return total


def _paired_cost(rows: list[tuple[int, int]]) -> dict:
    """Per pair, the step with the hooks minus the one without (us): the hooks' cost per step."""
    if not rows:
        return {"pairs": 0}
    diffs = [(on - off) / 1e3 for on, off in rows]
    return {"pairs": len(rows), "hooks_us": round(statistics.median(diffs), 2),
            "hooks_mean_us": round(statistics.fmean(diffs), 2),
            "on_us": round(statistics.median(r[0] for r in rows) / 1e3, 1),
            "off_us": round(statistics.median(r[1] for r in rows) / 1e3, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--width", type=int, default=32)
    args = ap.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    counters = hwcount.Counters()  # before CUDA's, NCCL's and autograd's threads start: they count too
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(args.width, args.width).to(device), device_ids=[local_rank] if args.device == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, args.width, device=device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    clock = time.perf_counter_ns

    def block(n: int) -> list[list[int]]:
        rows = []
        for _ in range(n):
            t0 = clock()
            opt.zero_grad(set_to_none=True)
            t1 = clock()
            loss = model(x).square().mean()
            t2 = clock()
            loss.backward()
            t3 = clock()
            opt.step()
            t4 = clock()
            sync()
            t5 = clock()
            rows.append([t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0])
        return rows

    hooks = optimizer_mod._global_optimizer_post_hooks
    all_hooks = dict(hooks)

    def paired(n: int) -> list[tuple[int, int]]:
        """`n` pairs of steps, one with the global optimizer hooks (resctl's shim's among them) and one without,
        in an order drawn per pair (a loop's own step-to-step pattern, e.g. every other step slower, cancels): a
        machine whose speed drifts over tenths of a second (the H100 host's) drifts alike on both. (on, off) ns."""
        rows = []
        for _ in range(n):
            got = {}
            first_on = order.random() < 0.5
            for on in (first_on, not first_on):
                hooks.clear()
                if on:
                    hooks.update(all_hooks)
                t0 = clock()
                opt.zero_grad(set_to_none=True)
                model(x).square().mean().backward()
                opt.step()
                sync()
                got[on] = clock() - t0
            rows.append((got[True], got[False]))
        hooks.clear()
        hooks.update(all_hooks)
        return rows

    block(50)  # warm-up
    ours_before = _thread_cpu("resctl")
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    pairs: list[tuple[int, int]] = []
    order = random.Random(0)
    kinds = ("as_is", "no_opt_hooks", "no_gc")
    got: dict[str, list[list[int]]] = {k: [] for k in kinds}
    gc_before = [s["collections"] for s in gc.get_stats()]
    timeline = []
    for b in range(args.blocks):
        for kind in (kinds if b % 2 == 0 else kinds[::-1]):
            at, shares, before, hw0 = _started_ago(), Shares(), len(got[kind]), counters.read()
            if kind == "no_opt_hooks":
                hooks.clear()
            if kind == "no_gc":
                gc.disable()
            try:
                got[kind] += block(args.steps)
            finally:
                hooks.update(all_hooks)
                gc.enable()
            step = statistics.median(r[5] for r in got[kind][before:]) / 1e3
            timeline.append({"at": round(at, 2), "kind": kind, "step": round(step, 1), **shares.done(),
                             "hw": hwcount.Counters.diff(hw0, counters.read(), per=args.steps)})
        pairs += paired(args.steps)
    ours = _thread_cpu("resctl") - ours_before
    ru, n_steps = resource.getrusage(resource.RUSAGE_SELF), args.blocks * args.steps * 5
    per_step = {k: round((getattr(ru, f"ru_{k}") - getattr(ru0, f"ru_{k}")) / n_steps, 3)
                for k in ("minflt", "nvcsw", "nivcsw")}  # page faults, context switches a step
    gc_during = [s["collections"] - b for s, b in zip(gc.get_stats(), gc_before)]
    out = {k: {p: round(statistics.median(r[i] for r in rows) / 1e3, 2) for i, p in enumerate(PHASES)}
           for k, rows in got.items()}
    out["mean_step_us"] = {k: round(statistics.fmean(r[5] for r in rows) / 1e3, 2) for k, rows in got.items()}
    out["gc_collections_during"] = gc_during
    out["timeline"] = timeline
    out["paired"] = _paired_cost(pairs)
    out["resctl_threads_cpu_s"] = round(ours, 4)
    out["per_step"] = per_step
    out["facts"] = facts()
    out["hw_error"] = counters.error
    if dist.get_rank() == 0:
        print("PHASES " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
