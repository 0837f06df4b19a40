"""From a job's last line to its launcher's exit, torchrun vs `resctl run`, alternating.

bench/scripts/job_end.py (2 ranks, gloo: a few Adam steps, a barrier, rank 0 prints `DONE <time>`,
every rank leaves the process group) runs under each launcher in turn; the benchmark takes the time
from that line to the command's exit. resctl's monitor sleeps until a worker exits (default monitor
interval 5 s): a worker that exited between the monitor's look and its sleep used to hold the job's
end back by the whole interval, now and then. The slowest run shows it; the median hides it.

    python bench/bench_job_end.py --repeats 10
    python bench/bench_job_end.py --repeats 10 --resctl-path before=/tmp/before   # another checkout beside
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_happy_path import launcher
from bench.bench_kill_resume import env_for

SCRIPT = Path(__file__).resolve().parent / "scripts" / "job_end.py"
SLOW = 2.0  # seconds after the last line: a held-back end


def after_last_line(kind: str, run_dir: Path, paths: dict[str, str]) -> float:
    cmd = [*launcher(kind, 2, run_dir), str(SCRIPT)]
    env = env_for(kind, {k: v for k, v in os.environ.items() if k != "RESCTL_VERBOSE"}, paths)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    ended = time.time()
    done = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("DONE ")]
    if proc.returncode != 0 or not done:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return ended - float(done[0])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--resctl-path", action="append", default=[], metavar="LABEL=DIR",
                    help="also run the resctl in DIR (first on PYTHONPATH) as resctl@LABEL (repeatable)")
    args = ap.parse_args()
    paths = dict(v.split("=", 1) for v in args.resctl_path)
    kinds = ["torchrun", "resctl", *(f"resctl@{label}" for label in paths)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-end-"))
    seen: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(args.repeats):
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            seen[kind].append(after_last_line(kind, tmp / f"{kind}-{i}", paths))
        print(f"repeat {i + 1}: " + ", ".join(f"{k} {seen[k][-1]:.2f} s" for k in kinds), flush=True)
    print(f"\n{platform.node()} ({os.cpu_count()} cores), {args.repeats} repeats alternating, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; seconds from the last line to the exit")
    for kind in kinds:
        s = seen[kind]
        print(f"{kind:>20}: median {statistics.median(s):.2f} s, slowest {max(s):.2f} s, "
              f"{sum(x > SLOW for x in s)} of {len(s)} over {SLOW:g} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
