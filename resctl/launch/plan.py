"""Profile -> ft_launcher command line. Pure: nothing here starts a process or touches the disk.

`plan()` returns a `LaunchPlan`: the launcher's arguments, the environment resctl adds, the
files it must write first (the plan handed to workers), and a line per setting saying where it
came from. Golden tests pin `LaunchPlan.args` for every example profile and NVRx series.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from resctl.errors import UsageError
from resctl.launch import nvrx_flags
from resctl.launch.rdzv_rounds import IMPL_ENV, KEEP_ALIVE_ENV, MISSES_ENV
from resctl.launch.rendezvous import Rendezvous
from resctl.profile.load import Resolved
from resctl.profile.schema import Health, Profile, nnodes_range
from resctl.redact import redact_argv, redact_rdzv_conf

LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
LAUNCHER_ENTRY = "resctl.launch.ft_entry"  # LAUNCHER_MODULE behind resctl's version adapters
SHIM_MODULE = "resctl.shim"
SHIM_PATH = Path(__file__).resolve().parents[1] / "shim" / "__main__.py"
PLAN_FILE = "plan.json"
FT_CONFIG_FILE = "ft_config.yaml"
ENV_HELD = "<in the environment>"  # what plan.json keeps of a [launch.env] value: the name, never the value
# What NVIDIA documents for in-process restart; set only where the user has not.
ADDED_ENV = "RESCTL_ADDED_ENV"  # variables the plan set for the launcher only: comma list, unset in forked workers
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's --signals-to-handle, in its workers' environment
INPROCESS_ENV = {"TORCH_NCCL_RETHROW_CUDA_ERRORS": "0", "NCCL_NVLS_ENABLE": "0", "TORCH_CPP_LOG_LEVEL": "error"}


@dataclass(frozen=True)
class Target:
    """What the user asked to run: a script (or module, or executable) and its arguments."""

    script: str
    args: tuple[str, ...] = ()
    module: bool = False
    no_python: bool = False


@dataclass
class LaunchPlan:
    args: list[str]  # ft_launcher's arguments (its program is `launcher_argv()`)
    env: dict[str, str]  # added to the launcher's (and so the workers') environment
    files: dict[Path, str]  # written before launch
    dirs: list[Path]  # created before launch
    run_dir: Path
    run_id: str
    rendezvous: Rendezvous
    nvrx_version: str
    nvrx_series: str
    settings: list[tuple[str, str, str]] = field(default_factory=list)  # (setting, value, source)
    notes: list[str] = field(default_factory=list)
    metrics_port: int | None = None  # served by the resctl process, not passed to the launcher
    metrics_addr: str = "0.0.0.0"
    #: The memory tier's replica server (checkpoint.memory_replicate): its port (0: any free), started by
    #: the resctl process like the metrics endpoint; None: not replicated (off, or a single node).
    replica_port: int | None = None
    origins: dict[str, str] = field(default_factory=dict)  # "launch.run_dir" -> where its value came from
    layers: list[str] = field(default_factory=list)  # which recovery layers are on, and why (--dry-run)
    #: launch.term_timeout: after a forwarded stop, `resctl run` kills what is left once it is over.
    term_timeout: float = 60.0
    #: What the `resctl run` process watches in the events (resctl.health.watch); None: nothing.
    health: Health | None = None

    def command(self, program: Sequence[str] = ("ft_launcher",)) -> list[str]:
        return [*program, *self.args]

    def shell(self) -> str:
        return shlex.join(self.command())


def restart_policy(resolved: Resolved, nvrx_version: str) -> tuple[str, str]:
    """The --ft-restart-policy for this NVRx version and where it came from; UsageError if it cannot take it.

    `resctl profile validate` calls this too, with the installed NVRx, so it refuses what `run` refuses.
    """
    launch, inproc = resolved.profile.launch, resolved.profile.inprocess
    series = nvrx_flags.series_for(nvrx_version)
    traits = nvrx_flags.SERIES[series]
    policy, source = launch.restart_policy, resolved.source("launch.restart_policy")
    if policy == "auto":
        policy = "min-healthy" if (inproc.enabled and traits.has_min_healthy) else "any-failed"
        source = f"auto (NVRx {series}, inprocess.enabled={str(inproc.enabled).lower()})"
    if policy == "min-healthy" and not traits.has_min_healthy:
        raise UsageError(
            f"launch.restart_policy = \"min-healthy\" ({resolved.source('launch.restart_policy')}) is not accepted "
            f"by NVRx {nvrx_version} (removed in 0.6). Use \"any-failed\" or \"auto\"."
        )
    return policy, source


def owned_rendezvous_env(resolved: Resolved, series: str, policy: str) -> dict[str, str]:
    """The launcher's environment for resctl's rendezvous (resctl.launch.adapters), {} for NVRx's.
    "auto" takes resctl's where it can stand in (NVRx 0.4, the any-failed policy); "resctl" there
    only, a UsageError elsewhere."""
    launch = resolved.profile.launch
    if launch.rendezvous == "nvrx" or (launch.rendezvous == "auto" and (series != "0.4" or policy != "any-failed")):
        return {}
    where = resolved.source("launch.rendezvous")
    if series != "0.4":
        raise UsageError(f"launch.rendezvous = \"resctl\" ({where}) stands in for NVRx 0.4's rendezvous; NVRx "
                         f"{series} has its own barrier rendezvous. Use launch.rendezvous = \"nvrx\".")
    if policy != "any-failed":
        raise UsageError(f"launch.rendezvous = \"resctl\" ({where}) needs the any-failed restart policy, and "
                         f"this plan's is {policy} (in-process restart on NVRx 0.4 picks min-healthy). Set "
                         "launch.restart_policy = \"any-failed\" or launch.rendezvous = \"nvrx\".")
    return {IMPL_ENV: "resctl", KEEP_ALIVE_ENV: f"{launch.rdzv_keep_alive:g}",
            MISSES_ENV: str(launch.rdzv_keep_alive_misses)}


def plan_json(profile: Profile, run_id: str, run_dir: Path, nvrx_version: str, target: Target) -> str:
    """plan.json: what the workers and `resctl report` read. Secrets stay out: [launch.env] keeps only its
    names (workers get the values from the launcher's environment), rdzv_conf and script arguments are redacted."""
    dumped = profile.model_dump(mode="json", by_alias=True)
    dumped["launch"]["env"] = {name: ENV_HELD for name in dumped["launch"]["env"]}
    dumped["launch"]["rdzv_conf"] = redact_rdzv_conf(dumped["launch"]["rdzv_conf"])
    return json.dumps(
        {
            "run_id": run_id,
            "run_dir": str(run_dir),
            "nvrx_version": nvrx_version,
            "target": {"script": target.script, "args": redact_argv(target.args), "module": target.module},
            "profile": dumped,
        },
        indent=2,
    )


def read_plan(path: Path) -> dict[str, Any] | None:
    """A run's plan.json as a dict whose "profile" is a dict, or None when it is missing, unreadable or damaged.

    For readers that can do without it (`resctl report`, `tune-interval`, the metrics endpoint): a hand-edited or
    truncated plan.json must not crash them.
    """
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("profile", {}), dict):
        return None
    profile = data.get("profile", {})
    if not all(isinstance(v, dict) for v in profile.values()):
        return None
    return data


def _seconds(value: float) -> str:
    return f"{value:g}"


def plan(
    resolved: Resolved,
    target: Target,
    rendezvous: Rendezvous,
    nvrx_version: str,
    *,
    user_env: Mapping[str, str],
    cwd: Path,
) -> LaunchPlan:
    """Translate a resolved profile into the ft_launcher command for `target`."""
    p, src = resolved.profile, resolved.source
    launch, hb = p.launch, p.heartbeat
    series = nvrx_flags.series_for(nvrx_version)
    traits = nvrx_flags.SERIES[series]
    settings: list[tuple[str, str, str]] = []
    args: list[str] = []

    def add(flag: str, value: str, dotted: str, source: str | None = None) -> None:
        args.extend([flag, value])
        settings.append((flag, value, source or src(dotted)))

    run_id = rendezvous.run_id
    run_dir = Path(launch.run_dir.replace("{run_id}", run_id))
    if not run_dir.is_absolute():
        run_dir = cwd / run_dir

    add("--nnodes", rendezvous.nnodes or launch.nnodes, "launch.nnodes",
        f"rendezvous ({rendezvous.source})" if rendezvous.nnodes else None)
    add("--nproc-per-node", launch.nproc_per_node, "launch.nproc_per_node")
    if launch.node_rank is not None:
        # c10d ignores it (the rendezvous assigns ranks); passed because the user asked, as torchrun does.
        add("--node-rank", str(launch.node_rank), "launch.node_rank")
    add("--rdzv-backend", launch.rdzv_backend, "launch.rdzv_backend")
    add("--rdzv-endpoint", rendezvous.endpoint, "launch.rdzv_endpoint", f"rendezvous ({rendezvous.source})")
    add("--rdzv-id", run_id, "launch.rdzv_id", f"rendezvous ({rendezvous.source})")
    conf = dict(launch.rdzv_conf)
    if rendezvous.is_host is not None and "is_host" not in conf:
        conf["is_host"] = "1" if rendezvous.is_host else "0"
    if conf:
        add("--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items()), "launch.rdzv_conf",
            None if launch.rdzv_conf else f"rendezvous ({rendezvous.source})")
    if launch.master_addr:
        add("--master-addr", launch.master_addr, "launch.master_addr")
    if launch.master_port is not None:
        add("--master-port", str(launch.master_port), "launch.master_port")
    if launch.local_addr:
        add("--local-addr", launch.local_addr, "launch.local_addr")
    add("--max-restarts", str(launch.max_restarts), "launch.max_restarts")
    add("--monitor-interval", _seconds(launch.monitor_interval), "launch.monitor_interval")
    add("--term-timeout", _seconds(launch.term_timeout), "launch.term_timeout")
    add("--workers-stop-timeout", _seconds(launch.workers_stop_timeout), "launch.workers_stop_timeout")
    fork_workers = (launch.worker_start == "fork" and launch.start_method == "fork" and launch.use_shim
                    and not target.no_python)
    if fork_workers:
        add("--start-method", "fork", "launch.start_method")
    else:
        add("--start-method", launch.start_method, "launch.start_method")
    log_dir = Path(launch.log_dir) if launch.log_dir else run_dir / "logs"
    log_dir = log_dir if log_dir.is_absolute() else cwd / log_dir
    add("--log-dir", str(log_dir), "launch.log_dir")
    if launch.redirects != "0":
        add("--redirects", launch.redirects, "launch.redirects")
    if launch.tee != "0":
        add("--tee", launch.tee, "launch.tee")

    # Fault tolerance (rank monitors). Every value is passed explicitly: defaults differ by version.
    files: dict[Path, str] = {}
    disabled: list[str] = []  # timeouts set to none
    for name, attr in (("initial_rank_heartbeat_timeout", "initial_timeout"), ("rank_heartbeat_timeout", "timeout")):
        value = getattr(hb, attr)
        flag = "--ft-" + name.replace("_", "-")
        if value is not None:
            add(flag, _seconds(value), f"heartbeat.{attr}")
        elif traits.timeouts_accept_none:
            add(flag, "none", f"heartbeat.{attr}")
        else:
            disabled.append(name)
    if disabled:
        # 0.4 parses these flags as floats; "no timeout" can only be said in its YAML config.
        cfg = run_dir / FT_CONFIG_FILE
        files[cfg] = "fault_tolerance:\n" + "".join(f"  {name}: null\n" for name in disabled)
        add("--ft-cfg-path", str(cfg), "heartbeat.timeout")
    add("--ft-workload-check-interval", _seconds(hb.check_interval), "heartbeat.check_interval")
    if hb.sections:
        add("--ft-rank-section-timeouts", ",".join(f"{k}:{v:g}" for k, v in hb.sections.items()), "heartbeat.sections")
    if hb.out_of_section_timeout is not None:
        add("--ft-rank-out-of-section-timeout", _seconds(hb.out_of_section_timeout), "heartbeat.out_of_section_timeout")
    add("--ft-safety-factor", _seconds(hb.safety_factor), "heartbeat.safety_factor")
    add("--ft-rank-termination-signal", hb.termination_signal, "heartbeat.termination_signal")
    add("--ft-node-health-check-interval", _seconds(hb.node_health_check_interval), "heartbeat.node_health_check_interval")
    add("--ft-log-level", hb.log_level, "heartbeat.log_level")
    add("--ft-enable-nic-monitor", "true" if hb.nic_monitor else "false", "heartbeat.nic_monitor")
    if traits.gpu_reclaim_poll_flag:
        # How often a restart checks that the stopped workers' GPU memory is free again (NVRx: 2 s).
        add(traits.gpu_reclaim_poll_flag, "0.1", "launch", "resctl: restart latency (NVRx polls every 2 s)")

    policy, policy_source = restart_policy(resolved, nvrx_version)
    add("--ft-restart-policy", policy, "launch.restart_policy", policy_source)
    rdzv_env = owned_rendezvous_env(resolved, series, policy)
    if rdzv_env:
        settings.append(("(resctl) rendezvous", f"resctl's (keep-alive {launch.rdzv_keep_alive:g}s x "
                         f"{launch.rdzv_keep_alive_misses})", src("launch.rendezvous")))
    else:
        settings.append(("(resctl) rendezvous", "NVRx's", src("launch.rendezvous")
                         + ("" if launch.rendezvous == "nvrx" else f" (NVRx {series}, {policy})")))

    # What the workers run.
    if target.no_python and launch.use_shim:
        notes_shim = ["--no-python: the target is not Python, so it runs without resctl.shim"]
    else:
        notes_shim = []
    if target.no_python:
        args.append("--no-python")
        args.extend([target.script, *target.args])
    elif fork_workers:
        # ft_launcher forks each worker from its own process and runpy-runs the shim there.
        args.extend(["--run-path", str(SHIM_PATH)])
        args.extend(["--resctl-module"] if target.module else [])
        args.extend([target.script, *target.args])
    elif launch.use_shim:
        args.extend(["--module", SHIM_MODULE])
        args.extend(["--resctl-module"] if target.module else [])
        args.extend([target.script, *target.args])
    else:
        args.extend(["--module"] if target.module else [])
        args.extend([target.script, *target.args])

    env = {k: v for k, v in launch.env.items()}
    node_rank = launch.node_rank if launch.node_rank is not None else rendezvous.node_rank
    if node_rank is not None and series != "0.4" and "GROUP_RANK" not in user_env:
        env["GROUP_RANK"] = str(node_rank)  # 0.6+'s barrier rendezvous orders nodes by it
    if fork_workers:
        env["RESCTL_PRELOAD"] = "1"
        if "PYTHONUNBUFFERED" not in user_env:  # what `python -u` gives exec'd workers, less the variable
            env["PYTHONUNBUFFERED"] = "1"
            env[ADDED_ENV] = "PYTHONUNBUFFERED"  # a forked worker drops it again (shim/forked.py)
    # The workers' MASTER_ADDR/MASTER_PORT are the rendezvous store's (adapters._agent_store).
    if "TORCHELASTIC_SIGNALS_TO_HANDLE" not in user_env:
        env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = TORCHRUN_SIGNALS
    env.update(rdzv_env)
    env["RESCTL_RUN_DIR"] = str(run_dir)
    env["RESCTL_PLAN"] = str(run_dir / PLAN_FILE)
    env.update(inprocess_env(p, {**user_env, **env}))
    files[run_dir / PLAN_FILE] = plan_json(p, run_id, run_dir, nvrx_version, target)
    notes = [*rendezvous.notes, *notes_shim]
    if p.faults.schedule:
        notes.append(
            "FAULT DRILL ON: " + ", ".join(f"{f.kind}@step {f.step} rank {f.rank}" for f in p.faults.schedule)
            + f" ({src('faults.schedule')})"
        )
    if launch.metrics_port is not None:
        settings.append(("(resctl) metrics port", str(launch.metrics_port), src("launch.metrics_port")))
        settings.append(("(resctl) metrics address", launch.metrics_addr, src("launch.metrics_addr")))
    replica_port = _replica_port(p, rendezvous)
    if replica_port is not None:
        settings.append(("(resctl) memory replica port", str(replica_port) if replica_port else "any free",
                         src("checkpoint.memory_replicate_port")))
    # ft_launcher checks-then-creates its log dir: nodes sharing a run dir would race on it.
    dirs = [run_dir, log_dir]
    origins = {key: src(key) for key in ("launch.run_dir", "launch.log_dir", "launch.metrics_port", "launch.metrics_addr")}
    return LaunchPlan(args, env, files, dirs, run_dir, run_id, rendezvous, nvrx_version, series, settings, notes,
                      metrics_port=launch.metrics_port, metrics_addr=launch.metrics_addr, origins=origins,
                      layers=recovery_layers(p, series, fork_workers), replica_port=replica_port,
                      term_timeout=launch.term_timeout, health=p.health)


def inprocess_env(p: Profile, user_env: Mapping[str, str]) -> dict[str, str]:
    """What the plan adds to the workers' environment for in-process restart: NVIDIA's documented
    settings (INPROCESS_ENV) that `user_env` (the launcher's environment and [launch.env]) lacks.
    `resctl doctor` judges the environment with these added, as the workers will get it."""
    if not p.inprocess.enabled:
        return {}
    return {k: v for k, v in INPROCESS_ENV.items() if k not in user_env}


def _replica_port(p: Profile, rendezvous: Rendezvous) -> int | None:
    """The replica server's port when the memory tier is replicated: memory_every > 0,
    memory_replicate on, and possibly more than one node."""
    ck = p.checkpoint
    nnodes = rendezvous.nnodes or p.launch.nnodes
    if not ck.memory_every or not ck.memory_replicate or nnodes_range(nnodes)[1] < 2:
        return None
    return ck.memory_replicate_port


def recovery_layers(p: Profile, series: str, fork_workers: bool) -> list[str]:
    """Which recovery layers this plan turns on, and why (for --dry-run and the run's first lines)."""
    launch, inproc = p.launch, p.inprocess
    start = ("workers forked from the launcher, so a restart starts no new Python" if fork_workers
             else "workers are fresh interpreters (" + (f'launch.start_method = "{launch.start_method}"'
                                                        if launch.start_method != "fork"
                                                        else 'launch.worker_start = "exec"') + ")")
    out = [f"in-job restart: on, up to {launch.max_restarts} (launch.max_restarts): a dead, failed or hung worker "
           f"restarts the group; {start}; survivors leave at once, SIGKILL after "
           f"{launch.workers_stop_timeout:g}s (launch.workers_stop_timeout)"]
    if not inproc.enabled:
        out.append("in-process restart: off (inprocess.enabled = false): exceptions and hangs restart in-job")
        return out
    world = "every rank" if inproc.min_world_size is None else f"at least {inproc.min_world_size} ranks"
    out.append(f"in-process restart: on: exceptions and hangs re-run the script in the same processes with {world} "
               "(inprocess.min_world_size); a killed rank falls through to the in-job restart")
    if series != "0.4":
        out.append(f"in-process restart is deprecated since NVRx 0.6 (this is {series}; in-job restart with forked workers is the "
                   "fast path there); it still runs, but consider inprocess.enabled = false")
    return out

