"""What an import costs, for the deferred-import rule (issue 44, tests/unit/test_deferred_imports.py's HEAVY).

`modules`: for each `[AFTER:]MODULE`, in a fresh interpreter (resctl from PYTHONPATH), -X importtime's cumulative time of MODULE and the
CPU time (time.process_time) around `import MODULE`, after `import AFTER` when given (a submodule's cost on
top of its package); the median of --repeats runs. On a loaded machine the wall time -X importtime reports
grows with the load, the CPU time much less: the rule's threshold is on the CPU time.

`startup`: the CLI's and the worker/launcher entry modules' start-up, one or more source trees interleaved
(PYTHONPATH=TREE): the summed cumulative time of the top-level imports (-X importtime), the wall time, the
process's user+sys CPU time, and how many modules it imported; medians of --repeats runs.

    python bench/bench_imports.py modules torch torch.distributed:torch.distributed.checkpoint rich.console:rich.table
    python bench/bench_imports.py startup /path/to/old/tree .
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

STARTUP = {
    "resctl --help": ["-m", "resctl", "--help"],
    "resctl run --help": ["-m", "resctl", "run", "--help"],
    "import resctl.shim.runtime (the worker shim)": ["-c", "import resctl.shim.runtime"],
    "import resctl.launch.ft_entry (the launcher)": ["-c", "import resctl.launch.ft_entry"],
}


def module_cost(spec: str) -> tuple[float, float]:
    """(-X importtime ms, CPU ms) of one import in a fresh interpreter."""
    after, _, module = spec.rpartition(":")
    code = ("import sys, time\n" + (f"import {after}\n" if after else "") + "sys.stderr.write('MARK\\n')\n"
            f"c = time.process_time()\nimport {module}\nsys.stderr.write(f'CPU {{time.process_time() - c}}\\n')\n")
    run = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True,
                         cwd="/")  # -c puts the working directory first on sys.path: PYTHONPATH picks the tree
    tail = run.stderr.split("MARK\n")[-1]
    cpu = float(tail.split("CPU ")[-1]) * 1000
    for line in reversed(tail.splitlines()):
        if line.startswith("import time:") and line.split("|")[2].strip() == module:
            return int(line.split("|")[1]) / 1000, cpu
    return 0.0, cpu  # imported by AFTER already


def startup(tree: str, args: list[str]) -> tuple[float, float, float, int]:
    """(top-level imports ms, wall ms, CPU ms, modules) of one run of `python -X importtime ARGS`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=os.path.abspath(tree)), cwd="/", check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [line.split("|") for line in run.stderr.splitlines()
            if line.startswith("import time:") and "cumulative" not in line]
    top = sum(int(r[1]) for r in rows if not r[2].startswith("  "))  # depth 0: one space before the name
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return top / 1000, wall * 1000, cpu * 1000, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["modules", "startup"])
    parser.add_argument("names", nargs="+", help="[AFTER:]MODULE ... (modules) or source trees (startup)")
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    if opts.what == "modules":
        for spec in opts.names:
            runs = [module_cost(spec) for _ in range(opts.repeats)]
            print(f"{spec:60s} importtime {statistics.median(r[0] for r in runs):8.1f} ms  "
                  f"cpu {statistics.median(r[1] for r in runs):8.1f} ms", flush=True)
        return
    for name, args in STARTUP.items():
        runs: dict[str, list[tuple[float, float, float, int]]] = {tree: [] for tree in opts.names}
        for _ in range(opts.repeats):
            for tree in opts.names:  # interleaved: a load that changes meanwhile hits every tree alike
                runs[tree].append(startup(tree, args))
        for tree, rs in runs.items():
            med = [statistics.median(r[i] for r in rs) for i in range(4)]
            print(f"{name:45s} {tree:25s} imports {med[0]:7.1f} ms  wall {med[1]:7.1f} ms  cpu {med[2]:6.1f} ms  "
                  f"modules {med[3]:.0f}", flush=True)


if __name__ == "__main__":
    main()
