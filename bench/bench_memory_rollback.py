"""Rollback of the memory tier under kill -9 at random moments (issue 27, item 4).

Jobs of 2 CPU ranks (examples/train_ckpt.py, real ft_launcher, `checkpoint.memory_every = 1`,
disk checkpoints effectively off) are SIGKILLed `--kills-per-job` times each, a random rank at a
random moment once the cycle has trained a few steps; `resctl report`'s analysis gives each
recovery's rollback (the newest step reached before the kill minus the step resumed) and where
the state came from. The claim: every rollback <= memory_every (1: at memory_every = 1 the
back-pressure hold falls on every step), every state from memory.

    python bench/bench_memory_rollback.py --kills 100 [--kills-per-job 10] [--seed 27]

`--every M` (M > 1) runs the kills on tests/integration/rollback_pair.py instead: two forked gloo
ranks whose commits span many steps (as a GPU's do), `memory_every = M`, one kill after another;
the claim (issue 31's back-pressure bound): every rollback <= M + the steps a commit spans (measured
per kill from the ranks' marks), capped at M - 1 by the hold, so <= 2M - 1; with `--delay 0`
(commits shorter than a step) <= M + 1; every state from memory and the step's own.

    python bench/bench_memory_rollback.py --every 4 --kills 100 --seed 27 [--delay 0]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.jobs import events, finish, start, wait_for
from tests.integration.test_memory_rollback import job, kill_randomly, recoveries


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=100)
    ap.add_argument("--kills-per-job", type=int, default=10)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--every", type=int, default=1, help="memory_every; > 1: the forked pair with long commits")
    ap.add_argument("--delay", type=float, default=None, help="the pair's rank-1 commit, seconds (default: its own)")
    a = ap.parse_args()
    if a.every > 1:
        pair(a.every, a.kills, a.seed, a.delay)
        return
    rng = random.Random(a.seed)
    found: list[tuple[int, int, str | None]] = []
    with tempfile.TemporaryDirectory(prefix="resctl-bench-rollback-") as d:
        tmp = Path(d)
        for n in range(0, a.kills, a.kills_per_job):
            kills = min(a.kills_per_job, a.kills - n)
            name = f"job{n}"
            proc = start(job(tmp, name, steps=100_000), cwd=tmp)
            kill_randomly(tmp / name, proc, kills, rng)
            wait_for(lambda: {e["rank"] for e in events(tmp / name) if e["kind"] == "resume" and e["cycle"] == kills}
                     == {0, 1}, 240, "the last kill's recovery", proc)
            proc.terminate()  # enough: stop the job
            finish(proc, timeout=120)
            got = recoveries(tmp / name)[:kills]
            found += got
            print(json.dumps({"job": name, "recoveries": got}), flush=True)
    rollbacks = [r for _, r, _ in found]
    tiers = collections.Counter(t for _, _, t in found)
    print(json.dumps({
        "kills": len(found), "rollback_max": max(rollbacks), "rollback_median": statistics.median(rollbacks),
        "rollback_histogram": dict(sorted(collections.Counter(rollbacks).items())), "tiers": dict(tiers),
        "within_memory_every": sum(r <= 1 for r in rollbacks),
    }))


def pair(every: int, kills: int, seed: int, delay: float | None) -> None:
    script = Path(__file__).resolve().parents[1] / "tests" / "integration" / "rollback_pair.py"
    extra = [] if delay is None else ["--delay", str(delay)]
    with tempfile.TemporaryDirectory(prefix="resctl-bench-rollback-") as d:
        out = subprocess.run([sys.executable, str(script), d, "--every", str(every), "--kills", str(kills),
                              "--seed", str(seed), *extra], capture_output=True, text=True, check=True).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    rollbacks = [k["reached"] - k["resumed"] for k in lines[:-1]]
    bounds = [every + min(k["span"], every - 1) for k in lines[:-1]]  # every + the steps a commit spanned
    print(json.dumps({
        "every": every, "kills": len(rollbacks), "rollback_max": max(rollbacks),
        "rollback_median": statistics.median(rollbacks),
        "rollback_histogram": dict(sorted(collections.Counter(rollbacks).items())),
        "in_commit": lines[-1]["in_commit"], "within_memory_every": sum(r <= every for r in rollbacks),
        "spans": dict(sorted(collections.Counter(k["span"] for k in lines[:-1]).items())),
        "within_bound": sum(r <= b for r, b in zip(rollbacks, bounds)), "within_2m_1": sum(r <= 2 * every - 1 for r in rollbacks),
    }))


if __name__ == "__main__":
    main()
