"""How fast the goodput `Analyzer` reads a run's events (`resctl report`, the metrics endpoint), and the
same against another revision's `resctl/telemetry/goodput.py` (issue 34 split it into one accumulator per
concern behind a dispatcher: this measures what the dispatch costs).

    python bench/bench_analyzer.py                     # this tree only
    python bench/bench_analyzer.py --against 9bf3c36   # alternating with that revision's goodput.py

A synthetic run of `--ranks` ranks and `--steps` steps with a save every 50 steps, fed in time order;
`--repeat` runs of each, alternating, medians printed for the report pass (calibrate, history) and the
metrics pass (neither).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resctl.telemetry import goodput  # noqa: E402
from resctl.telemetry.events import Event, as_events  # noqa: E402


def events(ranks: int, steps: int) -> list[Event]:
    recs: list[dict[str, Any]] = [dict(t=r * 0.01, kind="start", rank=r, cycle=0, iteration=0) for r in range(ranks)]
    for step in range(1, steps + 1):
        recs += [dict(t=step + r * 1e-4, kind="step", rank=r, cycle=0, iteration=0, step=step, duration=1.0)
                 for r in range(ranks)]
        if step % 50 == 0:
            recs.append(dict(t=step + .2, kind="ckpt_stall", rank=0, cycle=0, iteration=0, step=step, seconds=.1,
                             waited=None, path=None))
            recs.append(dict(t=step + .6, kind="ckpt_persist", rank=0, cycle=0, iteration=0, step=step, seconds=.4,
                             bytes=100, recycled=None, path=None))
    return sorted(as_events(recs), key=lambda e: (e["t"], e["rank"]))


def revision(rev: str) -> ModuleType:
    """`resctl/telemetry/goodput.py` as it was at `rev` (it imports this tree's events and snapshots)."""
    text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:resctl/telemetry/goodput.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "goodput_then.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("goodput_then", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["goodput_then"] = mod
    spec.loader.exec_module(mod)
    return mod


def seconds(mod: ModuleType, evs: list[Event], report: bool) -> float:
    t0 = time.perf_counter()
    analyzer = mod.Analyzer(0, None, calibrate=report, history=report)
    for e in evs:
        analyzer.feed(e)
    analyzer.result()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--against", help="a git revision whose goodput.py runs alternately with this tree's")
    args = ap.parse_args()
    evs = events(args.ranks, args.steps)
    mods = {"this tree": goodput, **({args.against: revision(args.against)} if args.against else {})}
    for report in (True, False):
        times: dict[str, list[float]] = {name: [] for name in mods}
        for _ in range(args.repeat):
            for name, mod in mods.items():
                times[name].append(seconds(mod, evs, report))
        line = [f"{'report ' if report else 'metrics'} pass, {len(evs)} events:"]
        for name, ts in times.items():
            m = statistics.median(ts)
            line.append(f"{name} {m * 1e3:.0f} ms ({len(evs) / m / 1e3:.0f}k events/s)")
        if args.against:
            ratio = statistics.median(times["this tree"]) / statistics.median(times[args.against])
            line.append(f"ratio {ratio:.2f}")
        print("  ".join(line))


if __name__ == "__main__":
    main()
