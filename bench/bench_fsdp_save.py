"""A checkpoint save's stall in the training loop: FSDP2 beside DDP, under torchrun and under `resctl run`,
alternating (issue 41). Each case runs bench/scripts/fsdp_stall.py, which times the save calls itself:

- `fsdp2 resctl`: an FSDP2 job saving with `resctl.checkpoint.maybe_save` (sharded, async: staged, then written
  by a background thread on a gloo group of its own);
- `ddp resctl`:   the same model under DDP, the same call (replicated state: rank 0's async save);
- `fsdp2 dcp`:    the FSDP2 job saving with its own synchronous `torch.distributed.checkpoint.save` (what the
  script does without resctl's checkpoint API);

each under torchrun (the script configures `resctl.checkpoint` itself) and under `resctl run` (the shim
configures it from the profile: `--set checkpoint.dir=... checkpoint.interval_steps=...`).

    python bench/bench_fsdp_save.py --repeats 3                               # this CPU box, 2 gloo ranks
    python bench/bench_fsdp_save.py --repeats 3 --device cuda --nproc 1 --layers 12 --width 8192

Prints one row per case and launcher: the median of the steady saves' stalls (the first save apart), the
step, and the host-copy floor of one rank's state (copy_s); then the ratios the issue's targets name.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "fsdp_stall.py"
CASES = (("fsdp2", "resctl"), ("ddp", "resctl"), ("fsdp2", "dcp"))


def command(launcher: str, nproc: int, tmp: Path, case: tuple[str, str], args: argparse.Namespace) -> list[str]:
    model, save = case
    ck = tmp / f"ck-{launcher}-{model}-{save}"
    script = [str(SCRIPT), "--model", model, "--save", save, "--dir", str(ck), "--device", args.device,
              "--layers", str(args.layers), "--width", str(args.width), "--steps", str(args.steps),
              "--interval", str(args.interval), "--step-time", str(args.step_time), "--memory-every", str(args.memory_every), *(["--restore"] if args.restore else []),
              *(["--split-wait"] if args.split_wait else [])]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *script]
    return [sys.executable, "-m", "resctl", "run", "--nproc-per-node", str(nproc), "--run-dir", str(tmp / "runs"),
            "--set", f"checkpoint.dir={ck}", "--set", f"checkpoint.interval_steps={args.interval}",
            "--set", f"checkpoint.memory_every={args.memory_every}", *script]


def one(cmd: list[str], cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("STALL "):
            return json.loads(line[len("STALL "):])
    raise SystemExit(f"no STALL line (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds of pretend compute (sleep) a step")
    ap.add_argument("--memory-every", type=int, default=0, help="resctl run: checkpoint.memory_every")
    ap.add_argument("--restore", action="store_true", help="time a load after the loop (resctl saves)")
    ap.add_argument("--split-wait", action="store_true", help="time the wait for the previous write apart")
    ap.add_argument("--cases", default=",".join(f"{m}:{s}" for m, s in CASES))
    ap.add_argument("--launchers", default="torchrun,resctl")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    launchers = args.launchers.split(",")
    rows: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fsdp-") as tmp_s:
        tmp = Path(tmp_s)
        for r in range(args.repeats):
            for case in [tuple(c.split(":")) for c in args.cases.split(",")]:
                for launcher in launchers if r % 2 == 0 else launchers[::-1]:
                    res = one(command(launcher, args.nproc, tmp, case, args), tmp)
                    key = f"{case[0]} {case[1]} | {launcher}"
                    rows.setdefault(key, []).append(res)
                    print(f"[{r}] {key}: stall p50 {res['stall_p50_s']} s first {res['first_s']} s "
                          f"copy {res['copy_s']} s step {res['step_p50_s']} s efficiency {res['efficiency']} "
                          f"(steady {res.get('efficiency_steady')}) "
                          f"restore {res['restore']} waited {res['waited_s']}", file=sys.stderr, flush=True)
    summary = {}
    for key, results in rows.items():
        summary[key] = {name: round(statistics.median(r[name] for r in results), 4)
                        for name in ("stall_p50_s", "first_s", "copy_s", "step_p50_s", "efficiency")}
        summary[key]["restores"] = [r["restore"] for r in results]
        summary[key]["stalls_p50_each_run"] = [r["stall_p50_s"] for r in results]
    print(f"{'case | launcher':34}{'stall p50':>11}{'first':>9}{'copy':>9}{'step':>9}")
    for key, s in summary.items():
        print(f"{key:34}{s['stall_p50_s']:>11.4f}{s['first_s']:>9.4f}{s['copy_s']:>9.4f}{s['step_p50_s']:>9.4f}")
    for launcher in launchers:
        f, d, own = (summary.get(f"{m} {s} | {launcher}") for m, s in CASES)
        if f and d and own:
            print(f"{launcher}: FSDP2/DDP stall {f['stall_p50_s'] / d['stall_p50_s']:.2f}x (target <= 3x on CPU); "
                  f"FSDP2 stall / host copy {f['stall_p50_s'] / f['copy_s']:.2f}x (target <= 1.1x on the GPU); "
                  f"own sync DCP / resctl FSDP2 {own['stall_p50_s'] / f['stall_p50_s']:.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
