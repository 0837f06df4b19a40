"""A hot spare taking over a lost node: 3 network-namespace nodes, `launch.nnodes = "2"`; nodes 0 and 1 start
and train, node 2 starts once they do (NVRx 0.4.1's rendezvous keeps a node that comes to a full job on its
redundancy list, its launcher alive and waiting); node 1 is lost (every process in it SIGKILLed) at step >=
150 of examples/train_ckpt.py (0.1 s steps): seconds from the kill to the next step, now with the spare as
rank 1 (resumed from the last checkpoint), without the scheduler. Compare bench_node_loss_range.py (the
range's shrink: the job goes on smaller).

Usage: sudo python bench/bench_hot_spare.py WORKDIR [resctl run options...]   (prints one dict)
e.g. `... WORKDIR --set launch.rendezvous=resctl` (issue 25: resctl's rendezvous instead of NVRx's)
"""
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, wait_for
from tests.integration.netns_cluster import cluster

tmp = Path(sys.argv[1]); tmp.mkdir(parents=True, exist_ok=True)
run_dir = tmp / "run"
env0 = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def top() -> int:
    return max((e["step"] for e in events(run_dir) if e["kind"] == "step"), default=0) if run_dir.exists() else 0


with cluster(3) as c:
    procs = {}

    def start(i: int) -> None:
        job = ["run", "-p", str(LOCAL_PROFILE), "--nproc-per-node", "1",
               "--set", f"launch.rdzv_endpoint={c.addrs[0]}:29681", "--set", "launch.nnodes=2",
               "--set", f"launch.local_addr={c.addrs[i]}", "--set", f"launch.rdzv_id=hs{c.tag}",
               "--rdzv-conf", f"is_host={int(i == 0)},join_timeout=120,last_call_timeout=2",
               "--set", "heartbeat.timeout=6s", "--set", "launch.max_restarts=5",
               "--run-dir", str(run_dir), "--set", f"checkpoint.dir={tmp / 'ckpt'}", "--set", "checkpoint.interval_steps=5",
               *sys.argv[2:], str(EXAMPLES / "train_ckpt.py"), "--steps", "400", "--step-time", "0.1"]
        procs[i] = subprocess.Popen([*c.exec_prefix(i), sys.executable, "-m", "resctl", *job], cwd=tmp,
                                    env={**env0, "GLOO_SOCKET_IFNAME": c.dev(i)}, stdout=open(tmp / f"n{i}.log", "w"),
                                    stderr=subprocess.STDOUT, start_new_session=True)

    start(0)
    start(1)
    wait_for(lambda: top() >= 3, 300, "training")
    start(2)  # the spare
    wait_for(lambda: top() >= 150, 300, "step 150")
    killed = time.time()
    c.kill(1)
    codes = {}
    for i in (0, 2):
        try:
            codes[i] = procs[i].wait(timeout=300)
        except subprocess.TimeoutExpired:
            codes[i] = "timeout"
ev = events(run_dir)
# The first step after the spare's resume: a step of rank 0 in flight at the kill may be recorded after it.
resumed = min((e["t"] for e in ev if e["kind"] == "resume" and e["t"] > killed), default=None)
after = [e for e in ev if e["kind"] == "step" and resumed is not None and e["t"] > resumed]
spare = (tmp / "n2.log").read_text()
print({"codes": codes, "kill_to_next_step_s": round(min(e["t"] for e in after) - killed, 2) if after else None,
       "final_step": max((e["step"] for e in after), default=None), "world_after": sorted({e["rank"] for e in after}),
       "spare_trained": "resumed from checkpoint" in spare and "exit 0" in spare})
