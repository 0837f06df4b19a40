"""Run some compatibility cases N times each, to see a race (an expected.py entry that says "sometimes").

    .venv/bin/python -m tests.compat.repeat thread_nondaemon -n 10                 # fork, exec and torchrun
    .venv/bin/python -m tests.compat.repeat mp_fork_pool rng_restart -n 10 --launchers fork

Every launch of a resctl launcher is compared with a torchrun launch of the same round (the
torchrun run is launched each round too, unless `--launchers` leaves it out: then one torchrun
launch is the reference of every round). Prints one line per launch (`same` or what differs) and a
count per case and launcher; exits 1 when any launch differed. RESCTL_COMPAT_JOBS launches at a time.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import os
import sys

from tests.compat.cases import CASES
from tests.compat.runner import LAUNCHERS, Outcome, compare, launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.compat.repeat", description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", choices=sorted(CASES), metavar="CASE")
    parser.add_argument("-n", type=int, default=10, help="launches of each case under each launcher")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="comma-separated, of " + ", ".join(LAUNCHERS))
    parser.add_argument("-v", action="store_true", help="print the console of a launch that differed")
    args = parser.parse_args(argv)
    launchers = [name for name in args.launchers.split(",") if name]
    if not launchers or set(launchers) - set(LAUNCHERS):
        parser.error(f"--launchers: each of {', '.join(LAUNCHERS)}")
    rounds = args.n if "torchrun" in launchers else 1
    tasks = [(name, "torchrun", i) for name in args.cases for i in range(rounds)]
    tasks += [(name, lau, i) for i in range(args.n) for name in args.cases for lau in launchers if lau != "torchrun"]
    jobs = int(os.environ.get("RESCTL_COMPAT_JOBS", "3"))
    results: dict[tuple[str, str, int], Outcome] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(launch, CASES[name], lau): (name, lau, i) for name, lau, i in tasks}
        for future in concurrent.futures.as_completed(futures):
            results[futures[future]] = future.result()
    return _report(args.cases, launchers, args.n, rounds, results, args.v)


def _report(cases: list[str], launchers: list[str], n: int, rounds: int,
            results: dict[tuple[str, str, int], Outcome], verbose: bool) -> int:
    differed = collections.Counter[tuple[str, str]]()
    for name in cases:
        case = CASES[name]
        for i in range(rounds):  # the reference itself does what the case says
            ref = results[(name, "torchrun", i)]
            if ref.hang or ref.code != case.code:
                differed[(name, "torchrun")] += 1
                print(f"{name} torchrun #{i}: torchrun itself: code {ref.code} (case says {case.code}) {ref.hang}")
        for lau in launchers:
            if lau == "torchrun":
                continue
            for i in range(n):
                got = results[(name, lau, i)]
                diffs = compare(case, results[(name, "torchrun", i % rounds)], got)
                differed[(name, lau)] += bool(diffs)
                print(f"{name} {lau} #{i} ({got.wall:.1f} s): " + ("; ".join(diffs) if diffs else "same"))
                if diffs and verbose:
                    print("    " + "\n    ".join(got.raw[-60:]))
    print()
    for name in cases:
        for lau in launchers:
            runs = rounds if lau == "torchrun" else n
            print(f"{name:24} {lau:8} {runs - differed[(name, lau)]}/{runs} same as torchrun")
    return 1 if differed else 0


if __name__ == "__main__":
    sys.exit(main())
