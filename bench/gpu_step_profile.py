"""A step profile on the device (issue 31, item 2): bench/scripts/step_phases.py under torchrun,
`resctl run` (forked workers) and `resctl run --set launch.worker_start=exec`, alternating, `--repeats`
times; prints one JSON document with every run's phase medians (per block kind: as is, without the
global optimizer hooks, without the GC) and what each worker inherited. A launcher named `resctl+KEY=VALUE`
is resctl with `--set KEY=VALUE` (a variant: its own column); `resctl@DIR` (or `resctl_exec@DIR`) is resctl
with the checkout at DIR first on PYTHONPATH (another tree: the code before a change, a trial).

    python bench/gpu_step_profile.py --repeats 3 --device cuda
    python bench/gpu_step_profile.py --launchers torchrun,resctl,resctl+launch.late_preload=late
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
LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1"],
    "resctl": [sys.executable, "-m", "resctl", "run", "--nproc-per-node", "1"],
    "resctl_exec": [sys.executable, "-m", "resctl", "run", "--set", "launch.worker_start=exec", "--nproc-per-node", "1"],
}


def _hw(hw: dict | None) -> str:
    """A block's hardware counters a step, short (bench/scripts/hwcount.py)."""
    if not hw:
        return ""
    keys = ("instructions", "ipc", "cache_misses", "dtlb_misses", "itlb_misses", "branch_misses", "page_faults")
    return " ".join(f"{k.split('_')[0]} {hw[k]:.4g}" for k in keys if k in hw)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--launchers", default=",".join(LAUNCHERS))
    ap.add_argument("--late-after", type=float, default=5.0,
                    help="the summary's `late` columns: only blocks that began this many seconds into the worker")
    a = ap.parse_args()
    names = a.launchers.split(",")
    runs: dict[str, list[dict]] = {n: [] for n in names}
    tmp = Path(tempfile.mkdtemp(prefix="step-profile-"))
    for i in range(a.repeats):
        for n in (names if i % 2 == 0 else names[::-1]):
            base, *sets = n.split("+")
            base, _, tree = base.partition("@")
            env = dict(os.environ)
            if tree:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(tree).resolve()), env.get("PYTHONPATH")]))
            cmd = list(LAUNCHERS[base]) + [arg for kv in sets for arg in ("--set", kv)]
            if n.startswith("resctl"):
                cmd += ["--run-dir", str(tmp / f"{base}-{len(sets)}-{i}")]
            cmd += [str(HERE / "scripts" / "step_phases.py"), "--device", a.device, "--blocks", str(a.blocks),
                    "--steps", str(a.steps)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp, env=env)
            line = next((x for x in (proc.stdout + proc.stderr).splitlines() if x.startswith("PHASES ")), None)
            if line is None:
                runs[n].append({"error": (proc.stdout + proc.stderr)[-2000:]})
                continue
            runs[n].append(json.loads(line[len("PHASES "):]))
            r = runs[n][-1]
            print(f"{n}: step as_is {r['as_is']['step']} us, no hooks {r['no_opt_hooks']['step']}, no gc "
                  f"{r['no_gc']['step']}", file=sys.stderr, flush=True)
            print(f"   paired (hooks on/off step by step): {r.get('paired')}; resctl's threads "
                  f"{r.get('resctl_threads_cpu_s')} CPU-s; a step's faults and switches {r.get('per_step')}", file=sys.stderr)
            for b in r.get("timeline", []):
                print(f"   {b['at']:6.2f}s {b['kind']:13s} {b['step']:8.1f} us  main {b['main']:.2f} other "
                      f"{b['other_threads']:.2f} parent {b['parent']:.2f} host {b['host_busy']:.2f} {_hw(b.get('hw'))}",
                      file=sys.stderr)
    summary = {}
    for n, rs in runs.items():
        ok = [r for r in rs if "as_is" in r]
        if ok:
            summary[n] = {kind: {p: statistics.median(r[kind][p] for r in ok) for p in ok[0][kind]}
                          for kind in ("as_is", "no_opt_hooks", "no_gc")}
            late = [[b["step"] for b in r.get("timeline", []) if b["at"] >= a.late_after] for r in ok]
            summary[n]["late_step_medians"] = [statistics.median(x) if x else None for x in late]
            summary[n]["paired_hooks_us"] = [r.get("paired", {}).get("hooks_us") for r in ok]
            hw = [b["hw"] for r in ok for b in r.get("timeline", []) if b["kind"] == "as_is" and b.get("hw")]
            summary[n]["as_is_hw_per_step"] = {k: statistics.median(h[k] for h in hw) for k in hw[0]} if hw else None
    print(json.dumps({"summary": summary, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
