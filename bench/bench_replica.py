"""Benchmark memory-tier replication (checkpoint.memory_replicate) on one box, over loopback.

Does a memory snapshot still block the loop no longer than the copy when each one is also sent to a
buddy node's replica server? And how fast does a node that lost its memory get its state back from
the buddy? Measured side by side in one run, on `bench_checkpoint.Model` (Linear+Adam; `--params-m
89.5` is 1 GiB):

- save: `save_memory` blocked time, each right after a copy of the same tensors into preallocated
  buffers (the copy limit, paired: the box is noisy), in alternating blocks without and with
  replication (and with it, but without pausing the transfer during the copy, which is what
  `Replicator.paused` does); `--gap` seconds of pretend compute between saves (sleep). With replication on, the
  snapshot goes to a real `ReplicaServer` in another process (as `resctl run` runs it), over TCP on
  127.0.0.1; the transfers (`ckpt_replica` events) run in the background meanwhile.
- restore: a new process on an empty shared-memory root (the lost node, back) builds the model and a
  fresh Adam and times fetch + verify + restore of the newest copy from the buddy, alternating with
  the same restore from a local memory snapshot.

    python bench/bench_replica.py --params-m 89.5 --saves 6 --rounds 2 --restores 5

Prints one JSON document on stdout (progress on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_checkpoint import Model  # noqa: E402
from bench_memory_tier import copy_once  # noqa: E402

from resctl.checkpoint import memdir  # noqa: E402
from resctl.checkpoint.engine import Checkpointer  # noqa: E402
from resctl.telemetry.events import EventLog, read_events  # noqa: E402

med = statistics.median
RUN_ID = "bench-replica"
SERVER = r"""
import os, sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from resctl.checkpoint.replica import ReplicaServer
srv = ReplicaServer(sys.argv[2], 0, host="127.0.0.1", root=Path(sys.argv[3]))
print(srv.address("127.0.0.1"), flush=True)
sys.stdin.read()  # until the parent closes it
srv.close()
"""


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def block(ck: Checkpointer, model: Model, bufs: list[torch.Tensor], steps: range, gap: float) -> list[tuple[float, float, bool]]:
    """(blocked, paired copy limit, a transfer was in flight) of one save per step."""
    out = []
    tier = ck.memory_tier()
    assert tier is not None
    for step in steps:
        limit = copy_once(bufs, model.tensors())
        busy = tier.replicator is not None and tier.replicator.reading is not None
        t0 = time.perf_counter()
        ck.save_memory(model.state(), step)
        out.append((time.perf_counter() - t0, limit, busy))
        time.sleep(gap)
    ck.wait()
    if ck.memory_off:
        raise SystemExit(f"the memory tier turned itself off: {ck.memory_off}")
    return out


def summary(rows: list[tuple[float, float, bool]]) -> dict[str, Any]:
    return {"blocked_median_s": round(med(r[0] for r in rows), 4), "blocked_s": [round(r[0], 4) for r in rows],
            "paired_limit_median_s": round(med(r[1] for r in rows), 4),
            "paired_ratio_median": round(med(r[0] / r[1] for r in rows), 3),
            "saves_during_a_transfer": sum(r[2] for r in rows)}


CHILD = r"""
import sys, json
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/bench")
from bench_replica import restore
print(json.dumps(restore(sys.argv[2:])), flush=True)
"""


def restore(argv: list[str]) -> dict[str, Any]:
    """In a new process: a fresh model and Adam; time getting the newest snapshot back into them."""
    from resctl.checkpoint.memory import MemoryTier

    params_m, root, addr, where = float(argv[0]), Path(argv[1]), argv[2], argv[3]
    layers = 32 if params_m >= 100 else 4  # bench_checkpoint.Model's shape rule
    hidden = max(64, int(math.sqrt(params_m * 1e6 / layers)) // 64 * 64)
    mods: list[torch.nn.Module] = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    net = torch.nn.Sequential(*mods)
    opt = torch.optim.Adam(net.parameters(), lr=1e-5)  # fresh: no state yet, as after a restart
    state = {"model": net, "optim": opt}
    tier = MemoryTier(memdir.job_key(RUN_ID, ""), 0, run_id=RUN_ID, root=root)
    t0 = time.perf_counter()
    if where == "buddy":
        tier.replicate_to(addr)
        step = max(tier.buddy_steps(1))
        slot = tier.fetch(step)
    else:
        step, slot = max(tier.steps(1).items())
    fetched = time.perf_counter() - t0
    tier.restore(tier.verify(step, slot, state), state)
    seconds = time.perf_counter() - t0
    tier.close()
    return {"step": step, "seconds": seconds, "fetch_s": fetched,
            "checksum": float(next(iter(opt.state.values()))["exp_avg"].double().sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params-m", type=float, default=89.5)
    ap.add_argument("--saves", type=int, default=6, help="saves per block")
    ap.add_argument("--rounds", type=int, default=2, help="blocks without, then with replication, this many times")
    ap.add_argument("--gap", type=float, default=0.3, help="seconds of pretend compute between saves")
    ap.add_argument("--restores", type=int, default=5)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-replica-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    node_a, node_b, fresh = tmp / "a", tmp / "b", tmp / "fresh"
    for p in (node_a, node_b, fresh):
        p.mkdir()
    key = memdir.job_key(RUN_ID, "")
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(HERE.parent), key, str(node_b)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        addr = server.stdout.readline().strip()  # host:port#secret
        result = run(args, tmp, node_a, fresh, addr)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    result["machine"] = {"cpus": os.cpu_count(), "load": os.getloadavg()[0], "python": platform.python_version(),
                         "torch": torch.__version__}
    print(json.dumps(result, indent=1))


def run(args: argparse.Namespace, tmp: Path, node_a: Path, fresh: Path, addr: str) -> dict[str, Any]:
    os.environ[memdir.SHM_ENV] = str(node_a)
    model = Model(args.params_m, "cpu", 8)
    events = tmp / "events"
    ck = Checkpointer(dir=tmp / "ck", interval_steps=10**9, memory_every=1, run_id=RUN_ID, exclusive=False,
                      events=EventLog(events, rank=0))
    tier = ck.memory_tier()
    assert tier is not None
    bufs = [torch.empty(t.shape, dtype=t.dtype) for t in model.tensors()]
    say(f"state {sum(t.numel() * t.element_size() for t in model.tensors()) / 1e9:.3f} GB; warming both slots")
    block(ck, model, bufs, range(1, 3), 0)
    off: list[tuple[float, float, bool]] = []
    on: list[tuple[float, float, bool]] = []
    unpaused: list[tuple[float, float, bool]] = []
    step = 3
    for _ in range(args.rounds):
        tier.replicate_to(None)
        off += block(ck, model, bufs, range(step, step + args.saves), args.gap)
        step += args.saves
        tier.replicate_to(addr)
        on += block(ck, model, bufs, range(step, step + args.saves), args.gap)
        step += args.saves
        assert tier.replicator is not None
        tier.replicator.paused = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        unpaused += block(ck, model, bufs, range(step, step + args.saves), args.gap)
        step += args.saves
        say(f"round: off {med(r[0] for r in off):.3f} s, on {med(r[0] for r in on):.3f} s, "
            f"on without the pause {med(r[0] for r in unpaused):.3f} s")
    assert tier.replicator is not None
    tier.replicator.wait_idle(120)
    sent = [e for e in read_events(events) if e["kind"] == "ckpt_replica"]
    nbytes = sent[-1]["bytes"] if sent else 0
    out: dict[str, Any] = {
        "state_bytes": nbytes, "gap_s": args.gap, "without_replication": summary(off), "with_replication": summary(on),
        "with_replication_not_paused_during_the_copy": summary(unpaused),
        "replicated": {"snapshots_taken_with_replication": len(on) + len(unpaused), "snapshots_sent": len(sent),
                       "transfer_median_s": round(med(e["seconds"] for e in sent), 4) if sent else None,
                       "transfer_GBps_median": round(nbytes / med(e["seconds"] for e in sent) / 1e9, 2) if sent else None,
                       "failures": [e for e in read_events(events) if e["kind"] == "ckpt_replica_fail"]},
    }
    ck.close()
    out["restore"] = restores(args, ck, model, step, node_a, fresh, addr)
    return out


def restores(args: argparse.Namespace, ck: Checkpointer, model: Model, step: int, node_a: Path, fresh: Path,
             addr: str) -> dict[str, Any]:
    got: dict[str, list[dict[str, Any]]] = {"memory": [], "buddy": []}
    for i in range(args.restores):
        for where in ("memory", "buddy"):
            if where == "memory":
                # The child's zero-copy restore detaches the slot it used (new files): snapshot again
                # first, from a new tier (this one's mappings are of the files the child unlinked).
                again = Checkpointer(dir=node_a / "ck", interval_steps=10**9, memory_every=1, run_id=RUN_ID,
                                     exclusive=False)
                again.save_memory(model.state(), step + i)
                again.close()
                root = node_a
            else:
                shutil.rmtree(fresh, ignore_errors=True)  # the node lost its memory
                fresh.mkdir()
                root = fresh
            child = subprocess.run([sys.executable, "-c", CHILD, str(HERE.parent), str(args.params_m), str(root), addr,
                                    where], capture_output=True, text=True, env={**os.environ, memdir.SHM_ENV: str(root)})
            if child.returncode != 0:
                raise SystemExit(child.stderr[-3000:])
            got[where].append(json.loads(child.stdout.strip().splitlines()[-1]))
        say(f"restore {i + 1}: memory {got['memory'][-1]['seconds']:.3f} s, buddy {got['buddy'][-1]['seconds']:.3f} s")
    sums = {r["checksum"] for rows in got.values() for r in rows}
    return {where: {"median_s": round(med(r["seconds"] for r in rows), 4),
                    "fetch_median_s": round(med(r["fetch_s"] for r in rows), 4),
                    "samples_s": [round(r["seconds"], 4) for r in rows]}
            for where, rows in got.items()} | {"same_state": len(sums) == 1}


if __name__ == "__main__":
    main()
