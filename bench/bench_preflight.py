"""Cluster preflight time at N network-namespace nodes on this machine (`resctl doctor --cluster` on each).

Prints one JSON line per run: wall time of the N `resctl doctor --cluster` processes (interpreter, torch
import, preflight), the preflight itself on the host node (join -> verdict) and its phases, the verdict
and the measured numbers. Needs root, iproute2 and tc (tests/integration/netns_cluster.py).

Usage: sudo python bench/bench_preflight.py NODES RUNS
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.netns_cluster import cluster

PORT = 29651


def once(n: int) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with cluster(n) as c:
        began = time.monotonic()
        procs = [subprocess.Popen([*c.exec_prefix(i), sys.executable, "-m", "resctl", "doctor", "--cluster", "--json",
                                   "--set", f"launch.rdzv_endpoint={c.addrs[0]}:{PORT}", "--set", f"launch.nnodes={n}",
                                   "--set", f"launch.node_rank={i}", "--set", f"launch.rdzv_id=b{c.tag}"],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
                 for i in range(n)]
        outs = [p.communicate()[0] for p in procs]
        wall = time.monotonic() - began
    doc = json.loads(outs[0][outs[0].index("{"):])
    return {"nodes": n, "wall_s": round(wall, 2), "preflight_s": round(doc["seconds"], 2),
            "phases": {k: round(v, 2) for k, v in doc["phases"].items()}, "action": doc["action"],
            "all_gbps": doc["all_gbps"], "links_gbps": [round(x["link_gbps"], 3) for x in doc["nodes"]],
            "gflops": [round(x["gflops"], 1) for x in doc["nodes"]], "why": [x["why"] for x in doc["nodes"] if x["why"]]}


def main() -> None:
    n, runs = int(sys.argv[1]), int(sys.argv[2])
    for _ in range(runs):
        print(json.dumps(once(n)), flush=True)


if __name__ == "__main__":
    main()
