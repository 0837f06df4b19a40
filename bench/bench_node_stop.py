"""SIGTERM to one node only (one pod evicted, one node's step signalled): network-namespace nodes, one worker each,
examples/train_ckpt.py (0.05 s steps), node 1's `resctl run` SIGTERMed at step >= 20:

- fixed:  `launch.nnodes = "2"`, no spare: seconds from the SIGTERM until node 0 has exited too (143), and the
          stop step (every rank's final checkpoint);
- range:  `launch.nnodes = "1:2"`: seconds from the SIGTERM to node 0's next step, alone, from the stop step;
- spare:  `launch.nnodes = "2"` and node 2 waiting as a spare: seconds from the SIGTERM to the next step, the
          spare as rank 1 from the stop step.

Usage: sudo python bench/bench_node_stop.py WORKDIR [RUNS] [CASE,...]   (prints one dict per run and case)
"""
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.netns_cluster import cluster
from tests.integration.node_jobs import Nodes

CASES = {"fixed": ("2", 2), "range": ("1:2", 2), "spare": ("2", 3)}
if len(sys.argv) > 3:  # only these cases
    CASES = {k: v for k, v in CASES.items() if k in sys.argv[3].split(",")}
work = Path(sys.argv[1])
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
for run in range(runs):
    for case, (nnodes, n) in CASES.items():
        tmp = work / f"r{run}-{case}"
        tmp.mkdir(parents=True)
        with cluster(n) as c:
            nodes = Nodes(c, tmp, nnodes, 29751, steps=200)
            nodes.start(0)
            nodes.start(1)
            nodes.wait(lambda: nodes.started() == {0, 1}, 300, "the two nodes' workers")
            if n == 3:
                nodes.start(2)
                nodes.wait_said(2, "this node is a spare", 300)
            nodes.release()
            nodes.wait(lambda: nodes.top() >= 20, 300, "step 20")
            t_sig, m_sig = time.time(), time.monotonic()
            os.kill(nodes.procs[1].pid, signal.SIGTERM)
            first = nodes.finish([0], 300) if case == "fixed" else {}
            gone = time.monotonic() - m_sig
            codes = {**first, **nodes.finish(list(range(n)), 300)}
        ev = nodes.events()
        stop = max((e["step"] for e in ev if e["kind"] == "stop"), default=None)
        resumed = [e for e in ev if e["kind"] == "resume" and e["t"] > t_sig]
        resumes = sorted((e["rank"], e["step"]) for e in resumed)
        # A step in flight at the SIGTERM (before the stop step) is recorded after it: time from the resume on.
        after = [e["t"] for e in ev if e["kind"] == "step" and resumed and e["t"] > min(r["t"] for r in resumed)]
        out = {"run": run, "case": case, "codes": codes, "stop_step": stop, "resumed": resumes,
               "final_step": nodes.top()}
        if case == "fixed":
            out["node0_exited_s"] = round(gone, 2)
        else:
            out["sigterm_to_next_step_s"] = round(min(after) - t_sig, 2) if after else None
        print(out, flush=True)
