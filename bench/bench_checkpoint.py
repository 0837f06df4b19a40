"""Benchmark resctl.checkpoint against its limits, side by side in one run.

Measures, on the same state and the same directory (and disk):

- blocked:   seconds `save()` holds the training loop with async on (median of the steady-state
             saves; the first save, which allocates and pins the staging arena, is reported apart),
             next to two copy limits measured in the same run: the *per-tensor* staging copy (the
             same tensors copied into preallocated buffers, pinned on CUDA, one synchronise: what
             async cannot beat) and one contiguous device-to-host copy of the same bytes (the link).
- persist:   bytes / seconds from staged to durable for the async engine (per writer count), next
             to `torch.save` + fsync of the same tensors (on CPU) and to a plain N-writer
             write + fsync of the same number of bytes from a hot buffer (the disk's bandwidth).
- efficiency: a training loop (`--state model`: a stack of Linear layers + Adam, stepped on the
             device) with `maybe_save` at intervals whose compute is a multiple of the measured
             persist time, against the same loop without checkpoints.
- diagnostics: zlib.crc32 throughput (1 and N threads), O_DIRECT N-writer write + fsync, and the
             filesystem the directory is on.

Examples::

    # CPU smoke run (seconds)
    python bench/bench_checkpoint.py --state model --params-m 20 --device cpu --writers 4 --dir /tmp/bench-ck
    # the H200 run (see bench/gpu_checkpoint.sh)
    python bench/bench_checkpoint.py --state model --params-m 537 --device cuda --writers 8 \
        --writer-sweep 4,8,16 --dir /root/bench-ck

Prints one JSON document on stdout (progress on stderr); `--json PATH` writes it there too.
"""

from __future__ import annotations

import argparse
import json
import math
import mmap
import os
import platform
import shutil
import statistics
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from resctl.checkpoint.engine import Checkpointer
from resctl.telemetry.events import EventLog

med = statistics.median


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class MemoryLog(EventLog):
    """An EventLog that keeps records in memory."""

    def __init__(self) -> None:
        super().__init__(None, rank=0)
        self.records: list[dict[str, Any]] = []

    def emit(self, kind: str, **fields: Any) -> None:
        self.records.append({"kind": kind, **fields})


# --- state -------------------------------------------------------------------------------------


def make_synthetic(size_gb: float, device: str) -> dict[str, torch.Tensor]:
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


class Model:
    """`layers` Linear(hidden, hidden) + ReLU, fp32 weights (TF32 matmuls on CUDA), Adam."""

    def __init__(self, params_m: float, device: str, batch: int) -> None:
        torch.backends.cuda.matmul.allow_tf32 = True  # what a real fp32 run uses on Hopper
        self.layers = 32 if params_m >= 100 else 4
        hidden = int(math.sqrt(params_m * 1e6 / self.layers))
        self.hidden = max(64, hidden // 64 * 64)
        torch.manual_seed(0)
        mods: list[torch.nn.Module] = []
        for _ in range(self.layers):
            mods += [torch.nn.Linear(self.hidden, self.hidden), torch.nn.ReLU()]
        self.net = torch.nn.Sequential(*mods).to(device)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=1e-5)
        self.x = torch.randn(batch, self.hidden, device=device)
        self.device = device
        self.step()  # materialise Adam's state (exp_avg, exp_avg_sq)

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.net(self.x).float().pow(2).mean()
        loss.backward()
        self.opt.step()

    def state(self) -> dict[str, Any]:
        return {"model": self.net, "optim": self.opt}

    def tensors(self) -> list[torch.Tensor]:
        out = list(self.net.state_dict().values())
        for s in self.opt.state_dict()["state"].values():
            out += [v for v in s.values() if isinstance(v, torch.Tensor)]
        return out

    @property
    def params(self) -> int:
        return sum(p.numel() for p in self.net.parameters())


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def free_pinned() -> None:
    fn = getattr(torch._C, "_host_emptyCache", None)
    if fn is not None:
        fn()


# --- limits ------------------------------------------------------------------------------------


def staging_limit(tensors: list[torch.Tensor], repeats: int) -> float:
    """Median seconds to copy `tensors` into preallocated buffers (pinned when any is on CUDA)."""
    on_cuda = any(t.is_cuda for t in tensors)
    bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=on_cuda) for t in tensors]
    times = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        for b, t in zip(bufs, tensors):
            b.copy_(t, non_blocking=on_cuda)
        if on_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del bufs
    free_pinned()
    return med(times[1:])


def contiguous_d2h(total: int, repeats: int) -> float:
    """Median seconds of one device-to-host copy of `total` bytes into pinned memory."""
    src = torch.empty(total, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    del src, dst
    free_pinned()
    torch.cuda.empty_cache()
    return med(times[1:])


def crc_gbps(threads: int, mb: int = 256) -> float:
    buf = os.urandom(mb << 20)
    zlib.crc32(buf)
    done: list[float] = []

    def run() -> None:
        zlib.crc32(buf)

    ts = [threading.Thread(target=run) for _ in range(threads)]
    t0 = time.perf_counter()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    done.append(time.perf_counter() - t0)
    return round(threads * len(buf) / done[0] / 1e9, 2)


# --- persist -----------------------------------------------------------------------------------


def engine(
    state: dict[str, Any], root: Path, writers: int, repeats: int, device: str, verify: bool = False,
    stage: str = "host",
) -> dict[str, Any]:
    log = MemoryLog()
    ck = Checkpointer(dir=root, async_=True, writers=writers, keep_last=1, stage=stage, rank=0, world_size=1,
                      events=log)
    blocked, drained, prune = [], [], []
    for step in range(1, repeats + 2):
        sync(device)
        t0 = time.perf_counter()
        ck.save(state, step)
        blocked.append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        ck.wait()  # so the next save's blocked time is not waiting for this one
        drained.append(time.perf_counter() - t1)
        prune.append(ck.last_prune_s or 0.0)
    extra: dict[str, Any] = {}
    if verify:
        # Load the last checkpoint back (into CPU copies of the state's tensors) and compare bitwise.
        from resctl.checkpoint import state as st

        entries, _ = st.snapshot_entries(state)
        live: list[torch.Tensor] = []
        st.flatten(entries, live, {})
        expect = [t.detach().cpu().clone() for t in live]
        # A load must fit the state it restores into: load into the same objects (in place), then compare.
        target: dict[str, Any] = dict(state)
        t0 = time.perf_counter()
        step = Checkpointer(dir=root, writers=writers, rank=0, world_size=1).load(target)
        extra["load_s"] = round(time.perf_counter() - t0, 3)
        got: list[torch.Tensor] = []
        loaded, _ = st.snapshot_entries(target)
        st.flatten(loaded, got, {})
        extra["load_step"] = step

        def raw(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(-1).view(torch.uint8)

        extra["bitwise_equal"] = len(got) == len(expect) and all(
            a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b)) for a, b in zip(expect, got)
        )
        del expect, got, target
    ck.close()
    persist = [r["seconds"] for r in log.records if r["kind"] == "ckpt_persist"]
    size = [r["bytes"] for r in log.records if r["kind"] == "ckpt_persist"][0]
    del ck
    free_pinned()
    shutil.rmtree(root, ignore_errors=True)
    # The first save allocates (and on CUDA pins) the staging arena: reported apart.
    return {"first_blocked": blocked[0], "blocked": blocked[1:], "persist": persist[1:], "bytes": size,
            "prune": prune[1:], **extra}


def torch_save(tensors: list[torch.Tensor], root: Path, repeats: int) -> list[float]:
    cpu = {f"t{i}": t.detach().cpu() for i, t in enumerate(tensors)}
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


def plain_multiwriter(total: int, root: Path, writers: int, repeats: int, direct: bool = False) -> list[float]:
    """N threads, one file each, write total/N bytes from a hot 64 MiB buffer, fsync; seconds each run.
    With `direct`, O_DIRECT from a page-aligned buffer (sizes rounded up to 4 KiB)."""
    chunk = 64 << 20
    buf_mm = mmap.mmap(-1, chunk)
    buf_mm.write(os.urandom(chunk))
    buf = memoryview(buf_mm)
    share = total // writers
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (getattr(os, "O_DIRECT", 0) if direct else 0)

    def write(path: Path, n: int) -> None:
        if direct:
            n = (n + 4095) // 4096 * 4096
        fd = os.open(path, flags, 0o644)
        try:
            left = n
            while left:
                left -= os.write(fd, buf[: min(left, len(buf))])
            os.fsync(fd)
        finally:
            os.close(fd)

    times = []
    errors: list[BaseException] = []
    for i in range(repeats):
        paths = [root / f"plain-{i}-{w}.bin" for w in range(writers)]

        def guarded(p: Path, n: int) -> None:
            try:
                write(p, n)
            except BaseException as err:  # noqa: BLE001
                errors.append(err)

        threads = [
            threading.Thread(target=guarded, args=(p, share + (total - share * writers if w == 0 else 0)))
            for w, p in enumerate(paths)
        ]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        times.append(time.perf_counter() - t0)
        for p in paths:
            p.unlink(missing_ok=True)
        if errors:
            raise errors[0]
    buf.release()
    buf_mm.close()
    return times


# --- training-loop efficiency ------------------------------------------------------------------


def train_loop(model: Model, steps: int, ck: Checkpointer | None, interval: int) -> float:
    """Wall seconds of `steps` training steps (each ends with a sync, as a loss.item() would),
    with `maybe_save` every `interval` steps when `ck` is given; the last write's drain is excluded."""
    sync(model.device)
    t0 = time.perf_counter()
    for i in range(1, steps + 1):
        model.step()
        sync(model.device)
        if ck is not None and i % interval == 0:
            ck.save(model.state(), i)
    wall = time.perf_counter() - t0
    if ck is not None:
        ck.wait()
    return wall


def efficiency(
    model: Model, root: Path, writers: int, persist_s: float, mults: list[float], saves: int, stage: str = "host"
) -> dict[str, Any]:
    # Step time, warmed up.
    train_loop(model, 5, None, 1)
    n = 20
    step_s = train_loop(model, n, None, 1) / n
    out: dict[str, Any] = {"stage": stage, "step_s": round(step_s, 5), "keep_last": 2, "runs": []}
    log = MemoryLog()
    ck = Checkpointer(dir=root, async_=True, writers=writers, keep_last=2, stage=stage, rank=0, world_size=1,
                      events=log)
    ck.save(model.state(), 0)  # allocate the arena outside the timed loops (once per process)
    ck.wait()
    for mult in mults:
        interval = max(1, math.ceil(mult * persist_s / step_s))
        steps = interval * saves
        base = train_loop(model, steps, None, interval)
        log.records.clear()
        with_ck = train_loop(model, steps, ck, interval)
        stalls = [r["seconds"] for r in log.records if r["kind"] == "ckpt_stall"]
        waits = [r["waited"] for r in log.records if r["kind"] == "ckpt_stall"]
        persists = [r["seconds"] for r in log.records if r["kind"] == "ckpt_persist"]
        base2 = train_loop(model, steps, None, interval)  # baseline again: drift check
        run = {
            "compute_over_write": mult,
            "interval_steps": interval,
            "interval_compute_s": round(interval * step_s, 3),
            "steps": steps,
            "saves": len(stalls),
            "wall_no_ckpt_s": [round(base, 3), round(base2, 3)],
            "wall_ckpt_s": round(with_ck, 3),
            "efficiency": round(((base + base2) / 2) / with_ck, 4),
            "efficiency_from_stalls": round(1 - sum(stalls) / with_ck, 4),
            "stall_s": [round(s, 4) for s in stalls],
            "waited_s": [round(w, 4) for w in waits],
            "persist_s": [round(p, 3) for p in persists],
        }
        say(f"efficiency stage={stage} x{mult}: {json.dumps(run)}")
        out["runs"].append(run)
    ck.close()
    del ck
    free_pinned()
    shutil.rmtree(root, ignore_errors=True)
    return out


# --- environment -------------------------------------------------------------------------------


def filesystem_of(path: Path) -> dict[str, Any]:
    real = os.path.realpath(path)
    best = ("", "?", "?")
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                dev, mnt, fstype = line.split()[:3]
                mnt = mnt.replace("\\040", " ")
                if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[0]):
                    best = (mnt, fstype, dev)
    except OSError:
        pass
    st = os.statvfs(real)
    return {"path": real, "mount": best[0], "fstype": best[1], "device": best[2],
            "free_gb": round(st.f_bavail * st.f_frsize / 1e9, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", choices=["synthetic", "model"], default="synthetic")
    ap.add_argument("--size-gb", type=float, default=1.0, help="synthetic state size")
    ap.add_argument("--params-m", type=float, default=537, help="model parameters, millions (Adam adds 2x)")
    ap.add_argument("--batch", type=int, default=8192, help="model input rows per step")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--writers", type=int, default=8, help="writers of the engine and of the plain baseline")
    ap.add_argument("--writer-sweep", default="", help="extra engine writer counts, e.g. 4,16")
    ap.add_argument("--stages", default="host", help="engine stage modes to measure: host,device")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--eff-mults", default="1.25,4", help="interval compute / write time, per efficiency run")
    ap.add_argument("--eff-saves", type=int, default=3)
    ap.add_argument("--skip", default="", help="comma list of: torchsave,direct,eff,crc,sweep")
    ap.add_argument("--dir", default="bench-checkpoints", help="directory on the disk to measure (removed after)")
    ap.add_argument("--json", default="", help="also write the summary here")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {
        "argv": sys.argv,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, python {platform.python_version()}, "
        f"torch {torch.__version__}",
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "fs": filesystem_of(root),
    }
    say(f"{out['machine']} gpu={out['gpu']} fs={out['fs']}")
    try:
        model: Model | None = None
        if args.state == "model":
            model = Model(args.params_m, args.device, args.batch)
            state: dict[str, Any] = model.state()
            tensors = model.tensors()
            out["model"] = {"params": model.params, "layers": model.layers, "hidden": model.hidden}
        else:
            state = make_synthetic(args.size_gb, args.device)
            tensors = list(state.values())
        total = sum(t.numel() * t.element_size() for t in tensors)
        out["bytes"] = total
        out["tensors"] = len(tensors)
        say(f"state: {len(tensors)} tensors, {total / 1e9:.3f} GB on {args.device}")

        stage = staging_limit(tensors, args.repeats)
        out["staging_copy_s"] = round(stage, 4)
        if args.device == "cuda":
            out["contiguous_d2h_s"] = round(contiguous_d2h(total, args.repeats), 4)
            out["contiguous_d2h_gbps"] = round(total / out["contiguous_d2h_s"] / 1e9, 2)
        say(f"staging copy {stage:.4f} s; contiguous d2h {out.get('contiguous_d2h_s')}")
        if "crc" not in skip:
            out["crc32_gbps"] = {"1": crc_gbps(1), str(args.writers): crc_gbps(args.writers)}
            say(f"crc32 GB/s: {out['crc32_gbps']}")

        counts = [args.writers] + ([int(w) for w in args.writer_sweep.split(",") if w] if "sweep" not in skip else [])
        counts = list(dict.fromkeys(counts))
        stages = [x for x in args.stages.split(",") if x]
        runs = [(stages[0], w) for w in counts] + [(g, args.writers) for g in stages[1:]]
        out["engine"] = {}
        for g, w in runs:
            key = str(w) if g == "host" else f"{g}-{w}"
            r = engine(state, root / f"engine-{key}", w, args.repeats, args.device, verify=w == args.writers,
                       stage=g)
            out["engine"][key] = {
                "stage": g,
                "writers": w,
                **{k: r[k] for k in ("load_s", "load_step", "bitwise_equal") if k in r},
                "first_blocked_s": round(r["first_blocked"], 4),
                "blocked_s": [round(x, 4) for x in r["blocked"]],
                "persist_s": [round(x, 3) for x in r["persist"]],
                "prune_s": [round(x, 3) for x in r["prune"]],
                "persist_gbps": round(r["bytes"] / med(r["persist"]) / 1e9, 3),
            }
            say(f"engine {key}: {out['engine'][key]}")

        if "torchsave" not in skip:
            ts = torch_save(tensors, root, args.repeats)
            out["torch_save_s"] = [round(x, 3) for x in ts]
            out["torch_save_gbps"] = round(total / med(ts) / 1e9, 3)
            say(f"torch.save+fsync: {ts}")
        free_pinned()
        out["plain"] = {}
        for w in dict.fromkeys([1, args.writers] + counts):
            mw = plain_multiwriter(total, root, w, args.repeats)
            out["plain"][str(w)] = {"s": [round(x, 3) for x in mw], "gbps": round(total / med(mw) / 1e9, 3)}
            say(f"plain {w}-writer write+fsync: {mw}")
        if "direct" not in skip:
            try:
                mw = plain_multiwriter(total, root, args.writers, args.repeats, direct=True)
                out["plain_direct"] = {"writers": args.writers, "s": [round(x, 3) for x in mw],
                                       "gbps": round(total / med(mw) / 1e9, 3)}
            except OSError as err:
                out["plain_direct"] = {"error": str(err)}
            say(f"plain O_DIRECT: {out['plain_direct']}")

        main_key = str(args.writers) if stages[0] == "host" else f"{stages[0]}-{args.writers}"
        main_engine = out["engine"][main_key]
        blocked = med(main_engine["blocked_s"])
        persist = med(main_engine["persist_s"])
        plain = out["plain"][str(args.writers)]["gbps"]
        out["summary"] = {
            "stage": stages[0],
            "blocked_s_median": round(blocked, 4),
            "staging_copy_s": out["staging_copy_s"],
            "blocked_over_staging": round(blocked / stage, 3),
            "blocked_over_contiguous_d2h": round(blocked / out["contiguous_d2h_s"], 3) if "contiguous_d2h_s" in out else None,
            "persist_s_median": round(persist, 3),
            "persist_gbps": main_engine["persist_gbps"],
            "plain_multiwriter_gbps": plain,
            "persist_over_multiwriter": round(main_engine["persist_gbps"] / plain, 3),
            "torch_save_over_multiwriter": round(out["torch_save_gbps"] / plain, 3) if "torch_save_gbps" in out else None,
        }
        for g in stages[1:]:
            e = out["engine"][f"{g}-{args.writers}"]
            out["summary"][f"{g}_blocked_s_median"] = round(med(e["blocked_s"]), 4)
            out["summary"][f"{g}_blocked_over_staging"] = round(med(e["blocked_s"]) / stage, 3)
            out["summary"][f"{g}_persist_over_multiwriter"] = round(e["persist_gbps"] / plain, 3)
        say(f"summary: {out['summary']}")

        if model is not None and "eff" not in skip:
            mults = [float(m) for m in args.eff_mults.split(",") if m]
            out["efficiency"] = [
                efficiency(model, root / f"eff-{g}", args.writers, persist, mults, args.eff_saves, stage=g)
                for g in stages
            ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
        doc = json.dumps(out, indent=2)
        if args.json:
            Path(args.json).write_text(doc)
        print(doc)


if __name__ == "__main__":
    main()
