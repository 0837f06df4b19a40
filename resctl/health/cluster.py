"""The cluster preflight as `resctl run` and `resctl doctor --cluster` start it: a `preflight.Config` from the
profile and the rendezvous, one child process per node, the verdict back (`preflight` has the tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

from resctl.health.preflight import Config, Verdict
from resctl.launch.rendezvous import Rendezvous
from resctl.profile.schema import Profile, nnodes_range, split_endpoint

MODULE = "resctl.health.preflight"


def config_for(profile: Profile, rdzv: Rendezvous) -> Config:
    """Where the nodes meet (the rendezvous host, `health.preflight_port` or the rendezvous port + 1), how many
    they are and this node's rank where the scheduler says it."""
    launch, health = profile.launch, profile.health
    host, port = split_endpoint(rdzv.endpoint, launch.rdzv_port)
    low, high = nnodes_range(rdzv.nnodes or launch.nnodes)
    node_rank = launch.node_rank if launch.node_rank is not None else rdzv.node_rank
    told = launch.rdzv_conf.get("is_host", "").strip().lower()
    if told in ("1", "true", "0", "false"):
        is_host = told in ("1", "true")
    elif rdzv.is_host is not None:
        is_host = rdzv.is_host
    else:
        is_host = node_rank == 0 if node_rank is not None else _is_local(host)
    from resctl.health.placement import node_name

    expected = _expected_hosts(rdzv, os.environ)
    if expected:  # the allocation: no more nodes come than the scheduler gave (a requeue on fewer included)
        high = min(high, len(expected))
        low = min(low, high)
    # Port 0 (a single node, standalone): the preflight's store binds a free port too, not port 1.
    return Config(host=host, port=health.preflight_port or (port + 1 if port else 0), nnodes_min=low, nnodes_max=high,
                  node_name=node_name(os.environ), expected_hosts=expected,
                  is_host=is_host, node_rank=node_rank, policy=health.preflight_policy, margin=health.preflight_margin,
                  min_gbps=health.preflight_min_gbps, mb=health.preflight_mb, timeout=health.preflight_timeout)


def _expected_hosts(rdzv: Rendezvous, env: Mapping[str, str]) -> tuple[str, ...]:
    """rank -> node name where the scheduler says it (Slurm: the nodelist in SLURM_NODEID order), so a node
    that never joins is named by host."""
    from resctl.launch.rendezvous import expand_hostlist

    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    if rdzv.source != "slurm" or not nodelist:
        return ()
    try:
        return tuple(expand_hostlist(nodelist))
    except ValueError:
        return ()


def _is_local(host: str) -> bool:
    """The endpoint names this machine (what ft_launcher's c10d store decides the same way)."""
    import socket

    if host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        theirs = {a[4][0] for a in socket.getaddrinfo(host, None)}
        mine = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return bool(theirs & mine)


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
