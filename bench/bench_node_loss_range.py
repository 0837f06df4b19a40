"""A node lost from a job with a node range: 3 network-namespace nodes, `launch.nnodes = "2:3"`, node 2 lost
(every process in it SIGKILLed) at step >= 15: seconds from the kill to the next step of the surviving
ranks, with no scheduler involved (ft_launcher's c10d rendezvous closes a new round with the 2 left).
This is the node range's elastic shrink; a hot spare taking over: bench_hot_spare.py.

Usage: sudo python bench/bench_node_loss_range.py WORKDIR [resctl run options...]   (prints one dict)
e.g. `... WORKDIR --set launch.rendezvous=resctl` (issue 25: resctl's rendezvous instead of NVRx's)
"""
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, last_step, wait_for
from tests.integration.netns_cluster import cluster

tmp = Path(sys.argv[1]); tmp.mkdir(parents=True, exist_ok=True)
run_dir = tmp / "run"
env0 = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
with cluster(3) as c:
    procs = []
    for i in range(3):
        job = ["run", "-p", str(LOCAL_PROFILE), "--nproc-per-node", "1",
               "--set", f"launch.rdzv_endpoint={c.addrs[0]}:29671", "--set", "launch.nnodes=2:3",
               "--set", f"launch.node_rank={i}", "--set", f"launch.local_addr={c.addrs[i]}",
               "--set", f"launch.rdzv_id=sp{c.tag}", "--rdzv-conf", f"is_host={int(i == 0)},join_timeout=60,last_call_timeout=2",
               "--set", "heartbeat.timeout=6s", "--set", "launch.max_restarts=5",
               "--run-dir", str(run_dir), "--set", f"checkpoint.dir={tmp / 'ckpt'}", "--set", "checkpoint.interval_steps=5",
               *sys.argv[2:], str(EXAMPLES / "train_ckpt.py"), "--steps", "60", "--step-time", "0.1"]
        procs.append(subprocess.Popen([*c.exec_prefix(i), sys.executable, "-m", "resctl", *job], cwd=tmp,
                     env={**env0, "GLOO_SOCKET_IFNAME": c.dev(i)}, stdout=open(tmp / f"n{i}.log", "w"),
                     stderr=subprocess.STDOUT, start_new_session=True))
    wait_for(lambda: last_step(run_dir, 2) >= 15, 300, "rank 2 at step 15")
    killed = time.time()
    c.kill(2)
    codes = []
    for p in procs[:2]:
        try:
            codes.append(p.wait(timeout=300))
        except subprocess.TimeoutExpired:
            codes.append("timeout")
ev = events(run_dir)
after = [e for e in ev if e["kind"] == "step" and e["t"] > killed and e["rank"] in (0, 1)]
starts = sorted({(e["cycle"], e["rank"]) for e in ev if e["kind"] == "start"})
print({"codes": codes, "kill_to_next_step_s": round(min(e["t"] for e in after) - killed, 2) if after else None,
       "final_step": max((e["step"] for e in after), default=None), "starts": starts,
       "world_after": sorted({e["rank"] for e in after})})
