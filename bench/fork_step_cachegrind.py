"""The forked step's cost in counts, not times (issue 43, item 2): bench/fork_step_variants.py's step loop (one-rank
DDP, `Linear(32, 32)`, SGD; gloo on a CPU) under valgrind's cachegrind, in a fresh interpreter and in children forked
from lighter and heavier parents. Each variant runs at two step counts; the difference of the loop process's totals,
over the difference of steps, is one step's instructions, data references, cache misses (cachegrind's simulated
L1 and last-level caches, addressed as the process really lays its memory out) and branch mispredictions: what
the imports, the fork and the set-up cost cancels out, and no other process on the machine changes a count.
A machine whose clocks drift block to block (the H100s of sessions 57-58, this 2-core VM) can still tell "more
work" from "the same work with worse locality" this way; what it cannot see is the TLB (not simulated).

    python bench/fork_step_cachegrind.py --variants fresh,fork,fork_heavy --steps 100,600
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
EVENTS = ("Ir", "I1mr", "ILmr", "Dr", "D1mr", "DLmr", "Dw", "D1mw", "DLmw", "Bc", "Bcm", "Bi", "Bim")


def totals(path: Path) -> dict[str, int]:
    """A cachegrind output file's summary: event -> count."""
    names: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("summary:"):
            return dict(zip(names, map(int, line.split()[1:])))
    raise ValueError(f"{path}: no summary line")


def by_function(path: Path, event: str = "Ir") -> dict[str, int]:
    """A cachegrind output file's counts of one event per function (`file:function`)."""
    names: list[str] = []
    out: dict[str, int] = {}
    fl = fn = ""
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("fl="):
            fl = line[3:]
        elif line.startswith("fn="):
            fn = line[3:]
        elif line[:1].isdigit() and names:
            counts = line.split()[1:]
            i = names.index(event)
            if i < len(counts):
                key = f"{Path(fl).name}:{fn}"
                out[key] = out.get(key, 0) + int(counts[i])
    return out


def function_diff(runs: dict[str, dict[int, Path]], low: int, high: int, top: int, event: str) -> dict[str, list]:
    """Per variant, the functions whose count of `event` a step differs most from the fresh process's."""
    def per_step(variant: str) -> dict[str, float]:
        a, b = by_function(runs[variant][low], event), by_function(runs[variant][high], event)
        return {k: (b.get(k, 0) - a.get(k, 0)) / (high - low) for k in set(a) | set(b)}

    fresh = per_step("fresh")
    out = {}
    for variant in runs:
        if variant == "fresh":
            continue
        mine = per_step(variant)
        diff = {k: mine.get(k, 0) - fresh.get(k, 0) for k in set(mine) | set(fresh)}
        out[variant] = [(k, round(d), round(fresh.get(k, 0)), round(mine.get(k, 0)))
                        for k, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:top]]
    return out


def counted_run(variant: str, steps: int, out_dir: Path, store_dir: str) -> Path:
    """One run of the variant under cachegrind: the output file of the process that ran the step loop."""
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--branch-sim=yes",
           f"--cachegrind-out-file={out_dir}/cg.%p", sys.executable, str(HERE / "fork_step_variants.py"),
           "--one", variant, "--steps", str(steps), "--store-dir", store_dir]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{variant} {steps}: no result\n{out.stderr[-2000:]}")
    return out_dir / f"cg.{json.loads(line[7:])['pid']}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="fresh,fork,fork_heavy")
    ap.add_argument("--steps", default="100,600", help="the two step counts (after the loop's 200 warm-up steps)")
    ap.add_argument("--top", type=int, default=15, help="functions to list per variant (those that differ most)")
    ap.add_argument("--event", default="Ir", help="the event the function list compares")
    ap.add_argument("--keep", help="a directory to keep cachegrind's files in")
    a = ap.parse_args()
    low, high = (int(s) for s in a.steps.split(","))
    rows, files = {}, {}
    with tempfile.TemporaryDirectory() as d:
        out_dir = Path(a.keep or d)
        out_dir.mkdir(parents=True, exist_ok=True)
        for variant in a.variants.split(","):
            files[variant] = {n: counted_run(variant, n, out_dir, d) for n in (low, high)}
            t = {n: totals(f) for n, f in files[variant].items()}
            rows[variant] = {e: round((t[high][e] - t[low][e]) / (high - low)) for e in EVENTS if e in t[high]}
            print(f"{variant}: {json.dumps(rows[variant])}", file=sys.stderr, flush=True)
        fresh = rows.get("fresh")
        ratios = {v: {e: round(r[e] / fresh[e], 3) for e in r if fresh.get(e)} for v, r in rows.items()} if fresh else {}
        functions = function_diff(files, low, high, a.top, a.event) if fresh else {}
    print(json.dumps({"per_step": rows, "vs_fresh": ratios, "functions": functions}, indent=1))


if __name__ == "__main__":
    main()
