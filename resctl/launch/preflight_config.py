"""The cluster preflight's `Config` from the profile and the rendezvous: where the nodes meet, how many
they are, this node's rank and whether it hosts the preflight's store. Here, beside the rendezvous it
reads, so that `resctl.health` (which runs the preflight) never imports `resctl.launch`."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from resctl.health.placement import node_name
from resctl.health.preflight import Config
from resctl.launch.rendezvous import Rendezvous, expand_hostlist
from resctl.profile.schema import Profile


def config_for(profile: Profile, rdzv: Rendezvous) -> Config:
    """Where the nodes meet (the rendezvous host, `health.preflight_port` or the rendezvous port + 1), how many
    they are and this node's rank where the scheduler says it."""
    launch, health = profile.launch, profile.health
    host, port = rdzv.address(launch.rdzv_port)
    low, high = rdzv.node_range(launch)
    node_rank = launch.node_rank if launch.node_rank is not None else rdzv.node_rank
    told = launch.rdzv_conf.get("is_host", "").strip().lower()
    if told in ("1", "true", "0", "false"):
        is_host = told in ("1", "true")
    elif rdzv.is_host is not None:
        is_host = rdzv.is_host
    else:
        is_host = node_rank == 0 if node_rank is not None else _is_local(host)
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
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    if rdzv.source != "slurm" or not nodelist:
        return ()
    try:
        return tuple(expand_hostlist(nodelist))
    except ValueError:
        return ()


def _is_local(host: str) -> bool:
    """The endpoint names this machine (what ft_launcher's c10d store decides the same way)."""
    if host in ("localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        theirs = {a[4][0] for a in socket.getaddrinfo(host, None)}
        mine = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return False
    return bool(theirs & mine)
