"""The fault-free path, `torchrun` vs. `resctl run` (default profile), side by side and alternating.

Two unmodified torchrun-style jobs, each run under both launchers in turn, `--repeats` times:

- a no-op job (bench/scripts/happy_noop.py: one line per rank): wall time from starting the
  command to its exit, and the console's non-empty line count;
- a tiny-step DDP loop (bench/scripts/happy_ddp.py) that times its own steps: the median step.

A new user's environment: OMP_NUM_THREADS unset, no resctl.toml (the default profile, AWS values:
monitor interval 5 s, heartbeat 900 s), the run directory in a temporary folder. Targets: no-op wall
within 0.5 s of torchrun; CPU step median within 20 us (GPU: within 2 %); console lines at most
torchrun's + 3. Each job's CPU seconds too (the command and every process it waited for: launcher, workers),
each repeat's pair side by side.

    python bench/bench_happy_path.py --repeats 5                       # this CPU box (gloo)
    python bench/bench_happy_path.py --repeats 5 --device cuda --nproc 8 # one GPU node (nccl)
    python bench/bench_happy_path.py --repeats 5 --width 1280             # steps long enough to be timed

Another resctl beside this one (an older commit's checkout, say): `--resctl-path LABEL=DIR` runs a
column `resctl@LABEL` with DIR first on PYTHONPATH, alternating with the others:

    git worktree add /tmp/before HEAD~1 && python bench/bench_happy_path.py --resctl-path before=/tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_kill_resume import env_for

HERE = Path(__file__).resolve().parent
NOOP = HERE / "scripts" / "happy_noop.py"
DDP = HERE / "scripts" / "happy_ddp.py"


def launcher(kind: str, nproc: int, run_dir: Path) -> list[str]:
    """torchrun, resctl (default profile), `resctl --set K=V` (kind "resctl --set K=V": a variant) or
    resctl@LABEL (another checkout: `run`'s PYTHONPATH)."""
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
    sets = kind.split()[1:] if not kind.startswith("resctl@") else []
    return [sys.executable, "-m", "resctl", "run", "--nproc-per-node", str(nproc), "--run-dir", str(run_dir), *sets]


def children_cpu() -> float:
    """CPU seconds of every process this one (and they, down the tree) waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(cmd: list[str], cwd: Path, kind: str = "", paths: dict[str, str] | None = None) -> tuple[float, list[str], float]:
    """`cmd` in a new user's environment; resctl@LABEL with `paths[LABEL]` first on PYTHONPATH. (wall seconds,
    the console's lines, CPU seconds of the command and every process it waited for)"""
    env = env_for(kind, {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "RESCTL_VERBOSE")},
                  paths or {})
    t0, cpu0 = time.perf_counter(), children_cpu()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n" + "\n".join(lines[-40:]))
    return wall, lines, cpu


def step_median(lines: list[str]) -> float:
    for line in lines:
        if line.startswith("STEPS "):
            fields = dict(part.split("=") for part in line.split()[1:])
            return float(fields["median_us"])
    raise SystemExit("the DDP job printed no STEPS line:\n" + "\n".join(lines[-20:]))


def step_rows(step: dict[str, list[float]], kinds: tuple[str, ...], device: str) -> None:
    """The step's rows: the median of the per-run medians against torchrun's, and each repeat's pair's ratio."""
    ts, rs = statistics.median(step["torchrun"]), statistics.median(step["resctl"])
    target = 20.0 if device == "cpu" else 0.02 * ts
    print(f"{'step (median of medians)':24}{ts:>10.1f}us{rs:>10.1f}us{rs - ts:>+10.1f}us  <= +{target:.1f} us "
          f"{'OK' if rs - ts <= target else 'MISSED'}")
    for kind in kinds[2:]:
        vs = statistics.median(step[kind])
        print(f"{kind}: step (median of medians) {vs:.1f} us ({vs - ts:+.1f} us, {100 * (vs / ts - 1):+.1f} % vs torchrun)")
    for kind in kinds[1:]:  # each repeat's pair ran back to back: their ratio leaves out the drift between repeats
        ratios = sorted(r / t for r, t in zip(step[kind], step["torchrun"]))
        print(f"{kind}: step / torchrun's in the same repeat: median {100 * (statistics.median(ratios) - 1):+.1f} %, "
              f"each {', '.join(f'{100 * (x - 1):+.1f}' for x in ratios)} %")


def cpu_rows(job: str, cpu: dict[str, list[float]], kinds: tuple[str, ...]) -> None:
    """A job's CPU seconds per launcher: the median, and each repeat's difference from torchrun's and resctl's run
    beside it."""
    for kind in kinds:
        line = f"{kind}: {job} CPU median {statistics.median(cpu[kind]):.2f} s"
        for other in ("torchrun", "resctl")[:kinds.index(kind)]:
            diffs = sorted(c - o for c, o in zip(cpu[kind], cpu[other]))
            line += (f"; - {other}'s beside it: median {statistics.median(diffs):+.2f} s, "
                     f"each {', '.join(f'{d:+.2f}' for d in diffs)}")
        print(line)


def noop_rows(wall: dict[str, list[float]], lines: dict[str, list[int]], kinds: tuple[str, ...]) -> None:
    """The no-op job's rows: its wall and console lines against torchrun's."""
    tw, rw = statistics.median(wall["torchrun"]), statistics.median(wall["resctl"])
    tl, rl = max(lines["torchrun"]), max(lines["resctl"])
    print(f"{'no-op wall (median)':24}{tw:>11.2f}s{rw:>11.2f}s{rw - tw:>+11.2f}s  <= +0.5 s "
          f"{'OK' if rw - tw <= 0.5 else 'MISSED'}")
    print(f"{'console lines (max)':24}{tl:>12d}{rl:>12d}{rl - tl:>+12d}  <= +3 {'OK' if rl - tl <= 3 else 'MISSED'}")
    for kind in kinds:  # a job's end held back by a monitor interval shows in the slowest, not the median
        print(f"{kind}: no-op wall median {statistics.median(wall[kind]):.2f} s, slowest {max(wall[kind]):.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=32,
                    help="the DDP loop's Linear(width, width): 1280 makes CPU steps of ~15-20 ms, long enough for "
                    "the shim to time each rank's own work (resctl.shim.busy)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--json", type=Path, help="also write the raw numbers here")
    ap.add_argument("--no-noop", action="store_true", help="the DDP loop only (more repeats of the step in the same time)")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE",
                    help="also run resctl with --set KEY=VALUE (its own column; repeatable)")
    ap.add_argument("--resctl-path", action="append", default=[], metavar="LABEL=DIR",
                    help="also run the resctl in DIR (first on PYTHONPATH) as resctl@LABEL (repeatable)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-happy-"))
    paths = dict(v.split("=", 1) for v in args.resctl_path)
    kinds = ("torchrun", "resctl", *(f"resctl --set {v}" for v in args.variant), *(f"resctl@{label}" for label in paths))
    wall: dict[str, list[float]] = {k: [] for k in kinds}
    lines: dict[str, list[int]] = {k: [] for k in kinds}
    step: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, dict[str, list[float]]] = {job: {k: [] for k in kinds} for job in ("no-op", "DDP")}
    ddp_args = [str(DDP), "--steps", str(args.steps), "--device", args.device, "--width", str(args.width)]
    for i in range(args.repeats):
        order = kinds if i % 2 == 0 else kinds[::-1]  # alternate who goes first
        for kind in order if not args.no_noop else ():
            seconds, out, used = run(launcher(kind, args.nproc, tmp / f"noop-{kind}-{i}") + [str(NOOP)], tmp, kind, paths)
            wall[kind].append(seconds)
            lines[kind].append(len(out))
            cpu["no-op"][kind].append(used)
        for kind in order:
            _, out, used = run(launcher(kind, args.nproc, tmp / f"ddp-{kind}-{i}") + ddp_args, tmp, kind, paths)
            step[kind].append(step_median(out))
            cpu["DDP"][kind].append(used)
        print(f"repeat {i + 1}: " + "; ".join((f"{k}: no-op {wall[k][-1]:.2f} s, " if wall[k] else f"{k}: ")
                                              + f"step {step[k][-1]:.1f} us" for k in kinds), flush=True)
    print(f"\n{platform.node()} ({os.cpu_count()} cores), python {platform.python_version()}, device {args.device}, "
          f"{args.nproc} ranks, {args.repeats} repeats alternating, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'':24}{'torchrun':>12}{'resctl':>12}{'diff':>12}  target")
    step_rows(step, kinds, args.device)
    if wall["torchrun"]:  # --no-noop: none ran
        noop_rows(wall, lines, kinds)
    for job, used in cpu.items():
        if used["torchrun"]:
            cpu_rows(job, used, kinds)
    if args.json:
        args.json.write_text(json.dumps({"wall": wall, "step_us": step, "lines": lines, "cpu_s": cpu,
                                         "device": args.device, "nproc": args.nproc}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
