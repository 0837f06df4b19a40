"""`resctl run`: torchrun's command line, resolved through a profile into ft_launcher."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, List, Optional

import typer

EPILOG = (
    "Examples: resctl run --nproc-per-node 2 train.py --epochs 3  |  "
    "resctl run -p examples/profiles/eks-p5.toml --dry-run train.py  |  "
    "resctl run --set heartbeat.timeout=2m --set inprocess.enabled=true train.py"
)

# flag name as shown -> profile key; a typed flag beats the profile file and RESCTL_* env.
FLAG_KEYS = {
    "nnodes": "launch.nnodes",
    "nproc_per_node": "launch.nproc_per_node",
    "node_rank": "launch.node_rank",
    "rdzv_backend": "launch.rdzv_backend",
    "rdzv_endpoint": "launch.rdzv_endpoint",
    "rdzv_id": "launch.rdzv_id",
    "standalone": "launch.standalone",
    "max_restarts": "launch.max_restarts",
    "master_addr": "launch.master_addr",
    "master_port": "launch.master_port",
    "local_addr": "launch.local_addr",
    "monitor_interval": "launch.monitor_interval",
    "start_method": "launch.start_method",
    "log_dir": "launch.log_dir",
    "redirects": "launch.redirects",
    "tee": "launch.tee",
    "run_dir": "launch.run_dir",
    "metrics_port": "launch.metrics_port",
    "metrics_addr": "launch.metrics_addr",
}

Opt = typer.Option


def run(
    script: Annotated[str, typer.Argument(help="Training script (or module with -m, or program with --no-python).")],
    script_args: Annotated[Optional[List[str]], typer.Argument(help="Arguments passed to the script.")] = None,
    profile: Annotated[Optional[Path], Opt("-p", "--profile", help="Profile file (default: ./resctl.toml when present).")] = None,
    set_: Annotated[Optional[List[str]], Opt("--set", help="Override one key: SECTION.KEY=VALUE (repeatable).")] = None,
    dry_run: Annotated[bool, Opt("--dry-run", help="Print the command, its environment and the source of every setting; start nothing.")] = False,
    nnodes: Annotated[Optional[str], Opt("--nnodes", help="Number of nodes or MIN:MAX.")] = None,
    nproc_per_node: Annotated[Optional[str], Opt("--nproc-per-node", "--nproc_per_node", help="Workers per node.")] = None,
    node_rank: Annotated[Optional[int], Opt("--node-rank", "--node_rank", help="This node's rank.")] = None,
    rdzv_backend: Annotated[Optional[str], Opt("--rdzv-backend", "--rdzv_backend", help="Rendezvous backend (c10d).")] = None,
    rdzv_endpoint: Annotated[Optional[str], Opt("--rdzv-endpoint", "--rdzv_endpoint", help="HOST:PORT, or auto.")] = None,
    rdzv_id: Annotated[Optional[str], Opt("--rdzv-id", "--rdzv_id", help="Job id shared by all nodes.")] = None,
    rdzv_conf: Annotated[Optional[str], Opt("--rdzv-conf", "--rdzv_conf", help="Extra rendezvous settings k=v,k=v.")] = None,
    standalone: Annotated[Optional[bool], Opt("--standalone", help="Single-node rendezvous on a free port.")] = None,
    max_restarts: Annotated[Optional[int], Opt("--max-restarts", "--max_restarts", help="In-job restarts before failing.")] = None,
    master_addr: Annotated[Optional[str], Opt("--master-addr", "--master_addr", help="Master address (static rendezvous).")] = None,
    master_port: Annotated[Optional[int], Opt("--master-port", "--master_port", help="Master port (static rendezvous).")] = None,
    local_addr: Annotated[Optional[str], Opt("--local-addr", "--local_addr", help="Address of this node.")] = None,
    monitor_interval: Annotated[Optional[str], Opt("--monitor-interval", "--monitor_interval", help="Launcher poll interval (5s, 500ms).")] = None,
    start_method: Annotated[Optional[str], Opt("--start-method", "--start_method", help="spawn, fork or forkserver.")] = None,
    log_dir: Annotated[Optional[str], Opt("--log-dir", "--log_dir", help="Worker log directory.")] = None,
    redirects: Annotated[Optional[str], Opt("-r", "--redirects", help="Redirect worker std streams to log files.")] = None,
    tee: Annotated[Optional[str], Opt("-t", "--tee", help="Tee worker std streams to log files.")] = None,
    module: Annotated[bool, Opt("-m", "--module", help="Run SCRIPT as a module (python -m).")] = False,
    no_python: Annotated[bool, Opt("--no-python", "--no_python", help="Run SCRIPT as a program, not with python.")] = False,
    run_dir: Annotated[Optional[str], Opt("--run-dir", help="Run directory for events and summaries ({run_id} expands).")] = None,
    metrics_port: Annotated[Optional[int], Opt("--metrics-port", help="Serve Prometheus metrics on this port (0: a free one).")] = None,
    metrics_addr: Annotated[Optional[str], Opt("--metrics-addr", help="Address metrics listen on (default 0.0.0.0; 127.0.0.1 keeps them on the node).")] = None,
    preflight: Annotated[bool, Opt("--preflight", help="Run `resctl doctor` first; a failed check starts nothing (exit 1).")] = False,
) -> None:
    """Start SCRIPT on every worker under NVRx ft_launcher, with resctl's profile and shim."""
    from resctl.cli.render import info
    from resctl.errors import UsageError
    from resctl.launch import execute
    from resctl.launch.plan import Target
    from resctl.profile.load import Layer

    given = {
        "nnodes": nnodes, "nproc_per_node": nproc_per_node, "node_rank": node_rank, "rdzv_backend": rdzv_backend,
        "rdzv_endpoint": rdzv_endpoint, "rdzv_id": rdzv_id, "standalone": standalone, "max_restarts": max_restarts,
        "master_addr": master_addr, "master_port": master_port, "local_addr": local_addr,
        "monitor_interval": monitor_interval, "start_method": start_method, "log_dir": log_dir,
        "redirects": redirects, "tee": tee, "run_dir": run_dir, "metrics_port": metrics_port,
        "metrics_addr": metrics_addr,
    }
    flags = Layer("flags")
    for name, value in given.items():
        if value is not None:
            dotted = FLAG_KEYS[name]
            flags.values[dotted] = value
            flags.labels[dotted] = "flag --" + name.replace("_", "-")
    if rdzv_conf:
        bad = [kv for kv in rdzv_conf.split(",") if "=" not in kv]
        if bad:
            raise UsageError(f"--rdzv-conf: {bad[0]!r} is not KEY=VALUE; write --rdzv-conf key=value,key2=value2")
        flags.values["launch.rdzv_conf"] = dict(kv.split("=", 1) for kv in rdzv_conf.split(","))
        flags.labels["launch.rdzv_conf"] = "flag --rdzv-conf"
    if module and no_python:
        raise UsageError("--module and --no-python cannot be used together (as with torchrun)")
    if not module and not no_python and not Path(script).is_file():
        raise UsageError(f"training script not found: {script} (working directory {os.getcwd()}); "
                         "check the path, or pass -m for a module")
    target = Target(script, tuple(script_args or ()), module=module, no_python=no_python)
    resolved, launch_plan = execute.prepare(profile, flags, set_ or [], target)
    info(resolved.loaded())
    if preflight and not dry_run:
        from resctl.cli.doctor_cmd import preflight_check

        if not preflight_check(resolved):
            raise typer.Exit(1)
    if dry_run:
        from resctl.cli.dry_run import render

        render(launch_plan)
        return
    from resctl.checkpoint.owner import check_free

    check_free(resolved.profile.checkpoint.dir)  # another live job writes there: CheckpointDirInUse, exit 2
    code = execute.run(launch_plan, on_event=info)
    raise typer.Exit(code)
