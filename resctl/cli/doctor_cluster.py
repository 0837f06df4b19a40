"""`resctl doctor --cluster` and `launch.preflight = "cluster"`: run the cluster preflight, render its verdict."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import typer
from rich.text import Text

from resctl.cli.render import err_console
from resctl.errors import EXIT_EXCLUDED, EXIT_FAILURE
from resctl.health import cluster
from resctl.health.preflight import Verdict
from resctl.launch.rdzv_rounds import IMPL_ENV

STYLE = {"ok": "green", "slow": "yellow", "broken": "bold red"}


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(console: Any, verdict: Verdict, rank: int | None) -> None:
    from rich.table import Table

    if verdict.nodes:
        table = Table("node", "host", "matmul GFLOP/s", "links GB/s (median)", "latency ms (worst)", "status", "why",
                      title=f"cluster preflight ({verdict.backend or '?'}, {len(verdict.members)} node(s))",
                      title_justify="left")
        for n in verdict.nodes:
            me = " (this node)" if n["rank"] == rank else ""
            table.add_row(f"{n['rank']}{me}", n["host"], _num(n["gflops"], ".4g"), _num(n["link_gbps"], ".3g"),
                          _num(n["latency_ms"], ".3g"), Text(n["status"], style=STYLE.get(n["status"], "")), n["why"])
        console.print(table)
    together = (f"; all together: {_num(verdict.all_gbps, '.3g')} GB/s, {_num(verdict.all_latency_ms, '.3g')} ms"
                if verdict.all_gbps is not None else "")
    text = f"resctl: cluster preflight: {verdict.action} in {verdict.seconds:.1f} s{together}"
    console.print(Text(text + (f"; {verdict.message}" if verdict.message else ""),
                       style="bold red" if verdict.action == "fail" else ""))


def preflight(resolved: Any, rdzv: Any, run_dir: Any = None,
              show: Any = lambda rank, verdict: None) -> tuple[int | None, Verdict]:
    """Run this node's part and `show` the verdict; with health.keep_out, the host node then keeps the bad nodes
    out (said on stderr). Shown first: under Slurm a requeue may end this process before it returns."""
    from resctl.launch.preflight_config import config_for

    cfg = config_for(resolved.profile, rdzv)
    rank, verdict = cluster.run(cfg)
    show(rank, verdict)
    cluster.keep_out(cfg, verdict, resolved.profile.health.keep_out, run_dir,
                     say=lambda line: err_console.print(f"resctl: {line}", markup=False, highlight=False))
    return rank, verdict


def run_preflight(resolved: Any, launch_plan: Any) -> int | None:
    """`resctl run` with launch.preflight = "cluster": None to go on (the plan's --nnodes set to the nodes left
    when some were excluded; a node that came to a full job goes on as a spare), else the exit code (1: failed, 94: this node left out)."""
    try:
        launch_plan.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # for bad-nodes.jsonl
        run_dir = launch_plan.run_dir
    except OSError:
        run_dir = None  # said again, with its fix, when the launch writes its files
    rank, verdict = preflight(resolved, launch_plan.rendezvous, run_dir,
                              show=lambda rank, verdict: render(err_console, verdict, rank))
    if verdict.action == "fail":
        return EXIT_FAILURE
    if verdict.action == "spare":  # the rendezvous keeps it as a spare once the tested nodes train
        from resctl.launch import spares

        timeout = float(resolved.profile.health.preflight_timeout)
        kind = "resctl" if launch_plan.env.get(IMPL_ENV) == "resctl" else "nvrx"
        try:
            full = spares.wait_for_full_round(launch_plan.rendezvous.endpoint, launch_plan.rendezvous.run_id,
                                              len(verdict.members), timeout, rendezvous=kind)
        except spares.UnreadableRendezvous as err:
            err_console.print(f"resctl: this node came to a full job and would wait as its spare, but {err}; "
                              f"exit {EXIT_FAILURE}", markup=False, highlight=False)
            return EXIT_FAILURE
        if not full:
            err_console.print(f"resctl: the tested nodes did not start training within {timeout:g} s "
                              f"(health.preflight_timeout): no job to be a spare of; exit {EXIT_FAILURE}")
            return EXIT_FAILURE
        return None
    if verdict.action == "exclude":
        if rank in verdict.excluded:
            err_console.print(f"resctl: this node ({rank}) is left out by the cluster preflight "
                              f"(health.preflight_policy = exclude); exit {EXIT_EXCLUDED}")
            return EXIT_EXCLUDED
        left = len([r for r in verdict.members if r not in verdict.excluded])
        i = launch_plan.args.index("--nnodes")
        launch_plan.args[i + 1] = str(left)  # the rendezvous waits for no one who has left
    return None


def doctor_cluster(resolved: Any, as_json: bool) -> int:
    """`resctl doctor --cluster`: 0 when every node is ok, else 1."""
    from resctl.launch import rendezvous

    rdzv = rendezvous.detect(resolved.profile.launch, os.environ, socket.gethostname())
    def show(rank: int | None, verdict: Verdict) -> None:
        if as_json:
            typer.echo(json.dumps({"rank": rank, **verdict.to_json()}, indent=2))
        else:
            render(err_console, verdict, rank)

    rank, verdict = preflight(resolved, rdzv, show=show)
    bad = verdict.action == "fail" or any(n["status"] != "ok" for n in verdict.nodes)
    return 1 if bad else 0
