"""Prediction vs reality for `resctl tune-interval`: calibrate on a short run, predict, run, compare.

    python bench/bench_interval.py                       # defaults: CPU, 1 worker, ~100 MB of state
    python bench/bench_interval.py --intervals 2 5 20 60 --steps 240 --width 2048 --step-time 0.05

1. *baseline*: `examples/train_ckpt.py` under `resctl run` with checkpoints effectively off (an
   interval longer than the run): the mean step time `t0` is the throughput without checkpoints.
2. *calibration*: one short run at `--calibrate-interval`; its events give the model's inputs
   (step compute, save stall, write time) exactly as `resctl tune-interval --from-run` reads them.
3. for every interval in `--intervals`: predict the efficiency with `resctl.tuning.evaluate`,
   run the job at that interval, and measure the efficiency as AWS does: throughput relative to
   the baseline, `t0 * steps / wall`, over the reference rank's steps (first step excluded).

Prints one table and, with `--json FILE`, writes every number. The model's efficiency is
`tau / P` with `tau = n * c_0` (step compute with no write running) and the write slowdown
`k = c_w / c_0` measured in the calibration run (`resctl.tuning.inputs.assemble`, as
`tune-interval --from-run` does). Next to it the table shows the model without the interference
term (`k = 1`, `t` = mean step compute of the calibration run: the model before 2026-11-29).
The measured efficiency divides by the baseline step time, so a machine whose speed drifts
between runs (other load) shows up as a prediction error too.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resctl.telemetry.events import read_events  # noqa: E402
from resctl.telemetry.goodput import analyze  # noqa: E402
from resctl.tuning.inputs import Inputs, assemble  # noqa: E402
from resctl.tuning.model import Costs, evaluate  # noqa: E402


def run_job(work: Path, name: str, interval: int, args: argparse.Namespace) -> Path:
    """One `resctl run` of examples/train_ckpt.py; returns its run directory."""
    run_dir = work / name
    ckpt = work / f"ckpt-{name}"
    shutil.rmtree(ckpt, ignore_errors=True)
    cmd = [
        sys.executable, "-m", "resctl", "run", "-p", str(REPO / "examples/profiles/local-cpu.toml"),
        "--nproc-per-node", str(args.nproc), "--run-dir", str(run_dir),
        "--set", f"checkpoint.interval_steps={interval}", "--set", f'checkpoint.dir="{ckpt}"',
        "--set", f"checkpoint.writers={args.writers}", "--set", "checkpoint.keep_last=1",
        str(REPO / "examples/train_ckpt.py"), "--steps", str(args.steps), "--width", str(args.width),
        "--step-time", str(args.step_time), "--device", args.device,
    ]
    t = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{name}: resctl run failed with exit {proc.returncode}")
    print(f"  {name}: interval {interval}, {time.monotonic() - t:.1f} s", file=sys.stderr, flush=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    return run_dir


def step_span(run_dir: Path) -> tuple[int, float]:
    """(steps after the first, seconds from the first to the last step) of rank 0."""
    steps = sorted(float(e["t"]) for e in read_events(run_dir) if e["kind"] == "step" and e["rank"] == 0)
    return len(steps) - 1, steps[-1] - steps[0]


def observed(run_dir: Path) -> dict[str, Any]:
    """What the model's inputs were in one measured run (its own calibration): the diagnosis of an error."""
    c = analyze(read_events(run_dir)).calibration
    return {"c0": c.step_time_idle, "cw": c.step_time_writing, "k": c.write_slowdown, "stall": c.stall,
            "waited": c.waited, "write": c.write, "step_mean": c.step_time}


def median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--intervals", type=int, nargs="+", default=[2, 5, 20, 60])
    ap.add_argument("--calibrate-interval", type=int, default=10)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--calibrate-steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat baseline + every interval this many times, interleaved; "
                         "the measured efficiency is the median over rounds of each round's own ratio")
    ap.add_argument("--width", type=int, default=2048, help="model width: state = 3 x (4 w^2 + 3 w + 1) floats")
    ap.add_argument("--step-time", type=float, default=0.05, help="pretend compute per step (sleep) in the script")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (passed to examples/train_ckpt.py)")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--work", default="", help="directory for runs and checkpoints (default: a temp dir)")
    ap.add_argument("--json", default="", help="write all numbers here")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="resctl-bench-interval-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir {work}", file=sys.stderr)
    cal_args = argparse.Namespace(**{**vars(args), "steps": args.calibrate_steps})
    cal = analyze(read_events(run_job(work, "calibration", args.calibrate_interval, cal_args))).calibration
    assert cal.stall is not None and cal.write is not None, "the calibration run saved no checkpoint"
    assembled = assemble(Inputs(mtbf_per_node=1e12), cal)  # the MTBF does not enter the efficiency
    costs = assembled.costs
    plain = Costs(step_time=cal.step_time, stall=cal.stall, write=cal.write)  # no interference term
    # Interleaved rounds: a drift of the machine's speed hits a round's baseline and its intervals alike.
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        base_n, base_s = step_span(run_job(work, f"r{r}-baseline", args.steps * 10, args))
        rnd: dict[str, Any] = {"baseline_step_s": base_s / base_n, "intervals": {}}
        for n in args.intervals:
            run_dir = run_job(work, f"r{r}-interval-{n}", n, args)
            steps, span = step_span(run_dir)
            rnd["intervals"][n] = {"step_s": span / steps, "efficiency": rnd["baseline_step_s"] * steps / span,
                                   "observed": observed(run_dir)}
            print(f"    round {r} interval {n}: measured {rnd['intervals'][n]['efficiency']:.2%}",
                  file=sys.stderr, flush=True)
        rounds.append(rnd)
    rows: list[dict[str, Any]] = []
    for n in args.intervals:
        pred, old = evaluate(n, costs), evaluate(n, plain)
        effs = [rnd["intervals"][n]["efficiency"] for rnd in rounds]
        measured = median(effs)
        obs = {key: median([v for v in (rnd["intervals"][n]["observed"][key] for rnd in rounds) if v is not None] or [0.0])
               for key in rounds[0]["intervals"][n]["observed"]}
        rows.append({"interval": n, "regime": pred.regime, "predicted": pred.efficiency, "measured": measured,
                     "measured_min": min(effs), "measured_max": max(effs),
                     "error_pp": 100 * (pred.efficiency - measured), "predicted_k1": old.efficiency,
                     "error_k1_pp": 100 * (old.efficiency - measured), "observed": obs,
                     "predicted_wait_s": pred.wait_s, "predicted_cycle_s": pred.cycle_s})
    t0 = median([rnd["baseline_step_s"] for rnd in rounds])
    cw = f"{cal.step_time_writing * 1e3:.2f} ms" if cal.step_time_writing is not None else "-"
    print(f"baseline step {t0 * 1e3:.2f} ms (median of {args.rounds}); calibration (interval "
          f"{args.calibrate_interval}, {args.calibrate_steps} steps): step compute "
          f"{cal.step_time * 1e3:.2f} ms mean, c_0 {costs.step_time * 1e3:.2f} ms ({cal.idle_samples} steps), "
          f"c_w {cw} ({cal.writing_samples} steps), slowdown k {costs.write_slowdown:.3f}, "
          f"stall {cal.stall * 1e3:.1f} ms, write {cal.write * 1e3:.0f} ms, "
          f"{(cal.write_bytes or 0) / 1e6:.0f} MB per checkpoint")
    print(f"{'interval':>8} {'regime':>14} {'predicted':>10} {'measured':>9} {'(min-max)':>15} {'error':>8} "
          f"{'k=1 model':>10} {'error':>8} | observed in the run: c_0, k, stall, wait, write")
    for r in rows:
        o = r["observed"]
        print(f"{r['interval']:>8} {r['regime']:>14} {r['predicted']:>10.2%} {r['measured']:>9.2%} "
              f"{r['measured_min']:>7.2%}-{r['measured_max']:>7.2%} {r['error_pp']:>+7.2f}pp "
              f"{r['predicted_k1']:>10.2%} {r['error_k1_pp']:>+7.2f}pp | {o['c0'] * 1e3:.1f} ms, {o['k'] or 0:.2f}, "
              f"{o['stall'] * 1e3:.1f} ms, {o['waited'] * 1e3:.1f} ms, {o['write'] * 1e3:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": platform.node(),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "baseline_step_s": t0,
            "calibration": vars(cal), "costs": vars(costs), "sources": assembled.sources, "rows": rows,
            "rounds": rounds}, indent=2, default=str))


if __name__ == "__main__":
    main()
