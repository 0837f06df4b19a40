"""Per-step time of a forked worker against torchrun's and an exec'd worker's, side by side (issue 20).

The same unmodified tiny DDP loop (bench/scripts/happy_ddp.py: gloo, 2 ranks, one Linear, SGD; it
times its own steps after a warm-up and rank 0 prints the median) runs under `torchrun`,
`resctl run` (forked workers, the default) and `resctl run --set launch.worker_start=exec`, round
after round, the order rotating each round so no launcher always goes first. Reported: per
launcher the median of the per-run medians and its ratio to torchrun's (target: forked within 5 %).
A new user's environment (OMP_NUM_THREADS unset, no resctl.toml), as bench_happy_path.py.

    nice -n 10 python bench/bench_fork_step.py --rounds 5 --steps 300

Kill -9 -> resumed on CPU is bench/bench_kill_resume.py (torchrun vs resctl, forked workers).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_happy_path import DDP, run, step_median  # noqa: E402

LAUNCHERS = ("torchrun", "fork", "exec")


def launcher(kind: str, nproc: int, run_dir: Path) -> list[str]:
    if kind == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone"]
    start = ["--set", "launch.worker_start=exec"] if kind == "exec" else []
    return [sys.executable, "-m", "resctl", "run", "--nproc-per-node", str(nproc), "--run-dir", str(run_dir), *start]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=32, help="Linear(width, width); 32 gives ~1 ms steps here")
    ap.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-fork-step-"))
    step: dict[str, list[float]] = {k: [] for k in LAUNCHERS}
    script = [str(DDP), "--steps", str(args.steps), "--width", str(args.width)]
    for i in range(args.rounds):
        order = LAUNCHERS[i % 3:] + LAUNCHERS[:i % 3]
        for kind in order:
            _, out = run(launcher(kind, args.nproc, tmp / f"{kind}-{i}") + script, tmp)
            step[kind].append(step_median(out))
        print(f"round {i + 1} ({', '.join(order)}): " + ", ".join(f"{k} {step[k][-1]:.1f} us" for k in LAUNCHERS),
              flush=True)
    med = {k: statistics.median(v) for k, v in step.items()}
    print(f"\n{platform.node()} ({os.cpu_count()} cores), python {platform.python_version()}, {args.nproc} ranks, "
          f"{args.steps} steps, width {args.width}, {args.rounds} rounds alternating, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'launcher':10}{'median step':>14}{'/ torchrun':>12}  per-run medians (us)")
    for k in LAUNCHERS:
        ratio = med[k] / med["torchrun"]
        verdict = "" if k == "torchrun" else ("  OK (<= 1.05)" if ratio <= 1.05 else "  MISSED (> 1.05)")
        print(f"{k:10}{med[k]:>11.1f} us{ratio:>12.3f}  {', '.join(f'{v:.0f}' for v in step[k])}{verdict}")
    if args.json:
        args.json.write_text(json.dumps({"step_us": step, "median_us": med, "nproc": args.nproc,
                                         "steps": args.steps, "width": args.width}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
