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

4. `--rounds R` repeats 1-3 R times, interleaved; each round predicts from its own calibration and
   measures against its own baseline, and the table shows the medians over rounds (with the range
   of the per-round errors), so a drift of the machine's speed between rounds cancels.

Prints one table and, with `--json FILE`, writes every number. The model's efficiency is
`tau / P` with `tau = n * c_0` (step compute with no write running) and the write slowdown
`k = c_w / c_0` measured in the calibration run (`resctl.tuning.inputs.assemble`, as
`tune-interval --from-run` does). Next to it the table shows the model without the interference
term (`k = 1`, `t` = mean step compute of the calibration run: the model before 2026-11-29), and
what each measured run itself saw (c_0, k, stall, wait, write): where a prediction misses, those
say which input moved.
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
from statistics import median
from typing import Any, Iterable

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
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}))
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"{name}: resctl run failed with exit {proc.returncode}")
    print(f"  {name}: interval {interval}, {time.monotonic() - t:.1f} s", file=sys.stderr, flush=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    return run_dir


def step_span(evs: list[dict[str, Any]]) -> tuple[int, float]:
    """(steps after the first, seconds from the first to the last step) of rank 0."""
    steps = sorted(float(e["t"]) for e in evs if e["kind"] == "step" and e["rank"] == 0)
    return len(steps) - 1, steps[-1] - steps[0]


def observed(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """What the model's inputs were in one measured run (its own calibration): the diagnosis of an error."""
    c = analyze(evs).calibration
    return {"c0": c.step_time_idle, "cw": c.step_time_writing, "k": c.write_slowdown, "stall": c.stall,
            "waited": c.waited, "write": c.write, "step_mean": c.step_time}


def median_known(values: Iterable[float | None]) -> float:
    """Median of the values that were measured (0.0 when none was)."""
    return median([v for v in values if v is not None] or [0.0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--intervals", type=int, nargs="+", default=[2, 5, 20, 60])
    ap.add_argument("--calibrate-interval", type=int, default=10)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--calibrate-steps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=1,
                    help="repeat baseline, calibration and every interval this many times, interleaved; each "
                         "round predicts from its own calibration and measures against its own baseline; the "
                         "table shows medians over rounds")
    ap.add_argument("--width", type=int, default=2048, help="model width: state = 3 x (4 w^2 + 3 w + 1) floats")
    ap.add_argument("--step-time", type=float, default=0.05, help="pretend compute per step (sleep) in the script")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (passed to examples/train_ckpt.py)")
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0,
                    help="OMP_NUM_THREADS of the workers (torch's compute threads; 0: torch's default, every core)")
    ap.add_argument("--work", default="", help="directory for runs and checkpoints (default: a temp dir)")
    ap.add_argument("--json", default="", help="write all numbers here")
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="resctl-bench-interval-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir {work}", file=sys.stderr)
    cal_args = argparse.Namespace(**{**vars(args), "steps": args.calibrate_steps})
    # Interleaved rounds, each with its own baseline and calibration: a drift of the machine's speed
    # between rounds hits a round's baseline, calibration and intervals alike. Every prediction is
    # still made from one short calibration run, before the runs it predicts.
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        base_n, base_s = step_span(list(read_events(run_job(work, f"r{r}-baseline", args.steps * 10, args))))
        cal = analyze(read_events(run_job(work, f"r{r}-calibration", args.calibrate_interval, cal_args))).calibration
        assert cal.stall is not None and cal.write is not None, "the calibration run saved no checkpoint"
        assembled = assemble(Inputs(mtbf_per_node=1e12), cal)  # the MTBF does not enter the efficiency
        costs = assembled.costs
        plain = Costs(step_time=cal.step_time, stall=cal.stall, write=cal.write)  # no interference term
        rnd: dict[str, Any] = {"baseline_step_s": base_s / base_n, "calibration": vars(cal), "costs": vars(costs),
                               "sources": assembled.sources, "intervals": {}}
        for n in args.intervals:
            pred, old = evaluate(n, costs), evaluate(n, plain)
            evs = list(read_events(run_job(work, f"r{r}-interval-{n}", n, args)))
            steps, span = step_span(evs)
            eff = rnd["baseline_step_s"] * steps / span
            rnd["intervals"][n] = {"step_s": span / steps, "efficiency": eff, "predicted": pred.efficiency,
                                   "predicted_k1": old.efficiency, "regime": pred.regime,
                                   "error_pp": 100 * (pred.efficiency - eff), "observed": observed(evs)}
            print(f"    round {r} interval {n} ({pred.regime}): predicted {pred.efficiency:.2%}, measured {eff:.2%}",
                  file=sys.stderr, flush=True)
        rounds.append(rnd)
    rows: list[dict[str, Any]] = []
    for n in args.intervals:
        per = [rnd["intervals"][n] for rnd in rounds]
        errs = [x["error_pp"] for x in per]
        obs = {key: median_known(x["observed"][key] for x in per) for key in per[0]["observed"]}
        regimes = sorted({x["regime"] for x in per})
        rows.append({"interval": n, "regime": "/".join(regimes), "predicted": median([x["predicted"] for x in per]),
                     "measured": median([x["efficiency"] for x in per]), "error_pp": median(errs),
                     "error_min_pp": min(errs), "error_max_pp": max(errs),
                     "predicted_k1": median([x["predicted_k1"] for x in per]),
                     "error_k1_pp": median([100 * (x["predicted_k1"] - x["efficiency"]) for x in per]),
                     "observed": obs})
    cal_keys = ("step_time_idle", "step_time_writing", "write_slowdown", "stall", "write", "write_bytes")
    cal_med = {k: median_known(rnd["calibration"][k] for rnd in rounds) for k in cal_keys}
    print(f"baseline step {median([rnd['baseline_step_s'] for rnd in rounds]) * 1e3:.2f} ms; calibration (interval "
          f"{args.calibrate_interval}, {args.calibrate_steps} steps), medians of {args.rounds} rounds: "
          f"c_0 {cal_med['step_time_idle'] * 1e3:.2f} ms, c_w {cal_med['step_time_writing'] * 1e3:.2f} ms, "
          f"k {cal_med['write_slowdown']:.3f}, stall {cal_med['stall'] * 1e3:.1f} ms, "
          f"write {cal_med['write'] * 1e3:.0f} ms, {cal_med['write_bytes'] / 1e6:.0f} MB per checkpoint")
    print(f"{'interval':>8} {'regime':>14} {'predicted':>10} {'measured':>9} {'error':>8} {'(min..max)':>16} "
          f"{'k=1 model':>10} {'error':>8} | observed in the runs: c_0, k, stall, wait, write")
    for r in rows:
        o = r["observed"]
        print(f"{r['interval']:>8} {r['regime']:>14} {r['predicted']:>10.2%} {r['measured']:>9.2%} "
              f"{r['error_pp']:>+7.2f}pp {r['error_min_pp']:>+7.2f}..{r['error_max_pp']:>+6.2f} "
              f"{r['predicted_k1']:>10.2%} {r['error_k1_pp']:>+7.2f}pp | {o['c0'] * 1e3:.1f} ms, {o['k'] or 0:.2f}, "
              f"{o['stall'] * 1e3:.1f} ms, {o['waited'] * 1e3:.1f} ms, {o['write'] * 1e3:.0f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": platform.node(),
            "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows, "rounds": rounds},
            indent=2, default=str))


if __name__ == "__main__":
    main()
