"""The cluster preflight as `resctl run` and `resctl doctor --cluster` start it: one child process per node
for a `preflight.Config` (built from the profile and the rendezvous by `resctl.launch.preflight_config`), the
verdict back (`preflight` has the tests), and the keep-out after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from resctl.health.preflight import Config, Verdict

MODULE = "resctl.health.preflight"


def keep_out(cfg: Config, verdict: Verdict, mode: str, run_dir: Path | None = None,
             say: Callable[[str], None] = lambda line: None) -> list[str]:
    """health.keep_out after a preflight, on the host node only (one drain per bad node): every slow or
    broken node whose name is known is kept out; a failed Slurm job is requeued to start without them.
    Each line is said as soon as it is done: a requeue may end this process before it returns."""
    from resctl.health import placement

    where = placement.scheduler(os.environ, mode)
    if where is None or not cfg.is_host:
        return []
    said = []
    for n in verdict.nodes:
        if n["status"] != "ok" and n["host"] not in ("", "?"):
            said.append(placement.keep_out(placement.BadNode(n["host"], f"preflight: {n['status']}: {n['why']}"),
                                           where, run_dir=run_dir))
            say(said[-1])
    if said and where == "slurm" and verdict.action == "fail":
        said.append(placement.requeue(nodes=requeue_nodes(cfg, verdict)))
        say(said[-1])
    return said


def requeue_nodes(cfg: Config, verdict: Verdict) -> int | None:
    """How many nodes the requeued job asks for: the good ones, when they are fewer than it has now and
    enough for launch.nnodes' minimum; None keeps its count (Slurm then places it on other nodes)."""
    allocated = len(cfg.expected_hosts) or cfg.nnodes_max
    good = sum(1 for n in verdict.nodes if n["status"] == "ok")
    return good if 1 <= good < allocated and good >= cfg.nnodes_min else None


def run(cfg: Config) -> tuple[int | None, Verdict]:
    """This node's part in a child process; (its rank, the verdict). A child that fails gives a fail verdict
    saying why (no traceback)."""
    doc = json.dumps({**asdict(cfg), "expected_hosts": list(cfg.expected_hosts)})
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    try:
        proc = subprocess.run([sys.executable, "-m", MODULE, doc], capture_output=True, text=True, env=env,
                              timeout=cfg.timeout * 2 + 60)
        out = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else {}
    except (subprocess.TimeoutExpired, ValueError, OSError) as err:
        out = {"error": f"{type(err).__name__}: {err}"}
        proc = None
    if "verdict" in out:
        return out.get("rank"), Verdict(**out["verdict"])
    why = out.get("error") or (proc.stderr.strip().splitlines()[-1] if proc is not None and proc.stderr.strip() else "no result")
    return cfg.node_rank, Verdict("fail", [], [], [], message=f"the preflight could not run on this node: {why}")
