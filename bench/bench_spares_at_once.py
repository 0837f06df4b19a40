"""Spares started together with the job: N network-namespace nodes started at the same instant with
`launch.nnodes = "2"` (NVRx 0.4.1's c10d rendezvous): seconds from the start to the first training step, which
node(s) became the spare (each says so on its console), and every node's exit code once the job (30 steps of
examples/train_ckpt.py, 0.05 s each) is done. N = 2 is the baseline.

Usage: sudo python bench/bench_spares_at_once.py WORKDIR [RUNS]   (prints one dict per run and node count)
"""
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.netns_cluster import cluster
from tests.integration.node_jobs import Nodes

work = Path(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
for run in range(runs):
    for n in (2, 3):
        tmp = work / f"r{run}-n{n}"
        tmp.mkdir(parents=True)
        with cluster(n) as c:
            nodes = Nodes(c, tmp, "2", 29741, steps=30)
            nodes.release()  # no hold: the first step as soon as the rendezvous is done
            t0 = time.monotonic()
            for i in range(n):
                nodes.start(i)
            nodes.wait(lambda: nodes.top() >= 1, 300, "the first step")
            first = time.monotonic() - t0
            codes = nodes.finish(list(range(n)), 300)
            wall = time.monotonic() - t0
        spares = [i for i in range(n) if "this node is a spare" in nodes.said(i)]
        print({"run": run, "nodes": n, "first_step_s": round(first, 2), "wall_s": round(wall, 1),
               "spare": spares, "codes": codes}, flush=True)
