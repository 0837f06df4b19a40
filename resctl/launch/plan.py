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
from typing import Callable, Mapping, Sequence

from resctl.errors import UsageError
from resctl.launch import nvrx_flags, prestart
from resctl.launch.rdzv_rounds import IMPL_ENV, KEEP_ALIVE_ENV, MISSES_ENV, STORE_ENV
from resctl.launch.rendezvous import Rendezvous
from resctl.profile import contract
from resctl.profile.contract import read_plan
from resctl.profile.load import Resolved
from resctl.profile.schema import Health, Heartbeat, Launch, Profile
from resctl.redact import redact_argv, redact_rdzv_conf

LAUNCHER_MODULE = "nvidia_resiliency_ext.fault_tolerance.launcher"
LAUNCHER_ENTRY = prestart.ENTRY  # LAUNCHER_MODULE behind resctl's version adapters
SHIM_MODULE = "resctl.shim"
SHIM_PATH = Path(__file__).resolve().parents[1] / "shim" / "__main__.py"
PLAN_FILE = contract.PLAN_FILE
FT_CONFIG_FILE = "ft_config.yaml"
ENV_HELD = "<in the environment>"  # what plan.json keeps of a [launch.env] value: the name, never the value
# What NVIDIA documents for in-process restart; set only where the user has not.
ADDED_ENV = contract.ADDED_ENV  # variables the plan set for the launcher only: comma list, unset in forked workers
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"  # torchrun's --signals-to-handle, in its workers' environment
__all__ = ["LaunchPlan", "Target", "plan", "plan_json", "read_plan", "restart_policy"]  # read_plan: the contract's
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
    """The launcher's environment for resctl's rendezvous (resctl.launch.rdzv_install), {} for NVRx's.
    "auto" (the default) takes resctl's on every NVRx version except with the min-healthy policy (it
    needs NVRx's worker states); "resctl" with that policy is a UsageError."""
    launch = resolved.profile.launch
    if launch.rendezvous == "nvrx" or (launch.rendezvous == "auto" and policy != "any-failed"):
        return {}
    if policy != "any-failed":
        raise UsageError(f"launch.rendezvous = \"resctl\" ({resolved.source('launch.rendezvous')}) needs the "
                         f"any-failed restart policy, and this plan's is {policy} (in-process restart on NVRx 0.4 "
                         "picks min-healthy). Set launch.restart_policy = \"any-failed\" or launch.rendezvous = \"nvrx\".")
    return {IMPL_ENV: "resctl", KEEP_ALIVE_ENV: f"{launch.rdzv_keep_alive:g}",
            MISSES_ENV: str(launch.rdzv_keep_alive_misses), STORE_ENV: launch.store}


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


def _seconds(value: float) -> str:
    return f"{value:g}"


@dataclass
class _Draft:
    """What the section builders add to, in order: ft_launcher's arguments (each with the source of its
    value), the settings shown, the environment, the files and the notes."""

    src: Callable[[str], str]
    args: list[str] = field(default_factory=list)
    settings: list[tuple[str, str, str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    files: dict[Path, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, flag: str, value: str, dotted: str, source: str | None = None) -> None:
        self.args.extend([flag, value])
        self.settings.append((flag, value, source or self.src(dotted)))


def plan(
    resolved: Resolved,
    target: Target,
    rendezvous: Rendezvous,
    nvrx_version: str,
    *,
    user_env: Mapping[str, str],
    cwd: Path,
) -> LaunchPlan:
    """Translate a resolved profile into the ft_launcher command for `target`: one builder per
    section, in the order of the command line."""
    p, launch = resolved.profile, resolved.profile.launch
    series = nvrx_flags.series_for(nvrx_version)
    d = _Draft(resolved.source)
    run_id = rendezvous.run_id
    run_dir = Path(launch.run_dir.replace("{run_id}", run_id))
    if not run_dir.is_absolute():
        run_dir = cwd / run_dir
    log_dir = Path(launch.log_dir) if launch.log_dir else run_dir / "logs"
    log_dir = log_dir if log_dir.is_absolute() else cwd / log_dir
    fork_workers = (launch.worker_start == "fork" and launch.start_method == "fork" and launch.use_shim
                    and not target.no_python)

    _rendezvous_section(d, launch, rendezvous)
    _restart_section(d, launch, fork_workers, log_dir)
    _fault_tolerance_section(d, p.heartbeat, nvrx_flags.SERIES[series], run_dir)
    rdzv_env = _policy_section(d, resolved, nvrx_version, series)
    shim_notes = _worker_section(d, launch, target, fork_workers)
    _environment_section(d, p, rendezvous, series, fork_workers, user_env, rdzv_env, run_dir)
    d.files[run_dir / PLAN_FILE] = plan_json(p, run_id, run_dir, nvrx_version, target)
    d.notes = [*rendezvous.notes, *shim_notes]
    replica_port = _resctl_section(d, p, rendezvous)
    # ft_launcher checks-then-creates its log dir: nodes sharing a run dir would race on it.
    dirs = [run_dir, log_dir]
    origins = {key: d.src(key) for key in ("launch.run_dir", "launch.log_dir", "launch.metrics_port",
                                           "launch.metrics_addr")}
    return LaunchPlan(d.args, d.env, d.files, dirs, run_dir, run_id, rendezvous, nvrx_version, series, d.settings,
                      d.notes, metrics_port=launch.metrics_port, metrics_addr=launch.metrics_addr, origins=origins,
                      layers=recovery_layers(p, series, fork_workers), replica_port=replica_port,
                      term_timeout=launch.term_timeout, health=p.health)


def _rendezvous_section(d: _Draft, launch: Launch, rendezvous: Rendezvous) -> None:
    """Nodes, processes and the launchers' rendezvous."""
    by_rdzv = f"rendezvous ({rendezvous.source})"
    d.add("--nnodes", rendezvous.nnodes or launch.nnodes, "launch.nnodes", by_rdzv if rendezvous.nnodes else None)
    d.add("--nproc-per-node", launch.nproc_per_node, "launch.nproc_per_node")
    if launch.node_rank is not None:
        # c10d ignores it (the rendezvous assigns ranks); passed because the user asked, as torchrun does.
        d.add("--node-rank", str(launch.node_rank), "launch.node_rank")
    d.add("--rdzv-backend", launch.rdzv_backend, "launch.rdzv_backend")
    d.add("--rdzv-endpoint", rendezvous.endpoint, "launch.rdzv_endpoint", by_rdzv)
    d.add("--rdzv-id", rendezvous.run_id, "launch.rdzv_id", by_rdzv)
    conf = dict(launch.rdzv_conf)
    if launch.store == "external":  # `resctl store` serves it: every node is a client (issue 42)
        conf["is_host"] = "0"
    elif rendezvous.is_host is not None and "is_host" not in conf:
        conf["is_host"] = "1" if rendezvous.is_host else "0"
    if conf:
        d.add("--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items()), "launch.rdzv_conf",
              None if launch.rdzv_conf else "launch.store" if launch.store == "external" else by_rdzv)
    if launch.master_addr:
        d.add("--master-addr", launch.master_addr, "launch.master_addr")
    if launch.master_port is not None:
        d.add("--master-port", str(launch.master_port), "launch.master_port")
    if launch.local_addr:
        d.add("--local-addr", launch.local_addr, "launch.local_addr")


def _restart_section(d: _Draft, launch: Launch, fork_workers: bool, log_dir: Path) -> None:
    """In-job restarts, how workers start and stop, and their logs."""
    d.add("--max-restarts", str(launch.max_restarts), "launch.max_restarts")
    d.add("--monitor-interval", _seconds(launch.monitor_interval), "launch.monitor_interval")
    d.add("--term-timeout", _seconds(launch.term_timeout), "launch.term_timeout")
    d.add("--workers-stop-timeout", _seconds(launch.workers_stop_timeout), "launch.workers_stop_timeout")
    d.add("--start-method", "fork" if fork_workers else launch.start_method, "launch.start_method")
    d.add("--log-dir", str(log_dir), "launch.log_dir")
    if launch.redirects != "0":
        d.add("--redirects", launch.redirects, "launch.redirects")
    if launch.tee != "0":
        d.add("--tee", launch.tee, "launch.tee")


def _fault_tolerance_section(d: _Draft, hb: Heartbeat, traits: nvrx_flags.Series, run_dir: Path) -> None:
    """The rank monitors. Every value is passed explicitly: defaults differ by version."""
    disabled: list[str] = []  # timeouts set to none
    for name, attr in (("initial_rank_heartbeat_timeout", "initial_timeout"), ("rank_heartbeat_timeout", "timeout")):
        value = getattr(hb, attr)
        flag = "--ft-" + name.replace("_", "-")
        if value is not None:
            d.add(flag, _seconds(value), f"heartbeat.{attr}")
        elif traits.timeouts_accept_none:
            d.add(flag, "none", f"heartbeat.{attr}")
        else:
            disabled.append(name)
    if disabled:
        # 0.4 parses these flags as floats; "no timeout" can only be said in its YAML config.
        cfg = run_dir / FT_CONFIG_FILE
        d.files[cfg] = "fault_tolerance:\n" + "".join(f"  {name}: null\n" for name in disabled)
        d.add("--ft-cfg-path", str(cfg), "heartbeat.timeout")
    d.add("--ft-workload-check-interval", _seconds(hb.check_interval), "heartbeat.check_interval")
    if hb.sections:
        d.add("--ft-rank-section-timeouts", ",".join(f"{k}:{v:g}" for k, v in hb.sections.items()), "heartbeat.sections")
    if hb.out_of_section_timeout is not None:
        d.add("--ft-rank-out-of-section-timeout", _seconds(hb.out_of_section_timeout), "heartbeat.out_of_section_timeout")
    d.add("--ft-safety-factor", _seconds(hb.safety_factor), "heartbeat.safety_factor")
    d.add("--ft-rank-termination-signal", hb.termination_signal, "heartbeat.termination_signal")
    d.add("--ft-node-health-check-interval", _seconds(hb.node_health_check_interval),
          "heartbeat.node_health_check_interval")
    d.add("--ft-log-level", hb.log_level, "heartbeat.log_level")
    d.add("--ft-enable-nic-monitor", "true" if hb.nic_monitor else "false", "heartbeat.nic_monitor")
    if traits.gpu_reclaim_poll_flag:
        # How often a restart checks that the stopped workers' GPU memory is free again (NVRx: 2 s).
        d.add(traits.gpu_reclaim_poll_flag, "0.1", "launch", "resctl: restart latency (NVRx polls every 2 s)")

    if traits.no_progress_flag:
        # One guard: resctl's (resctl.health.gate, from the step events, every series). NVRx's reads only a
        # checkpoint-iteration file resctl does not write, and would decide one step earlier in a restart.
        d.add(traits.no_progress_flag, "0", "health.no_progress_cycles",
              "resctl: its own count of steps decides (NVRx's, which reads a checkpoint-iteration file, is off)")


def _policy_section(d: _Draft, resolved: Resolved, nvrx_version: str, series: str) -> dict[str, str]:
    """The restart policy, and whose rendezvous the launchers use (its environment: {} for NVRx's)."""
    launch = resolved.profile.launch
    policy, policy_source = restart_policy(resolved, nvrx_version)
    d.add("--ft-restart-policy", policy, "launch.restart_policy", policy_source)
    rdzv_env = owned_rendezvous_env(resolved, series, policy)
    if rdzv_env:
        d.settings.append(("(resctl) rendezvous", f"resctl's (keep-alive {launch.rdzv_keep_alive:g}s x "
                           f"{launch.rdzv_keep_alive_misses})", d.src("launch.rendezvous")))
    else:
        d.settings.append(("(resctl) rendezvous", "NVRx's", d.src("launch.rendezvous")
                           + ("" if launch.rendezvous == "nvrx" else f" (NVRx {series}, {policy})")))
    return rdzv_env


def _worker_section(d: _Draft, launch: Launch, target: Target, fork_workers: bool) -> list[str]:
    """What the workers run; the notes it gives."""
    if target.no_python:
        d.args.append("--no-python")
    elif fork_workers:
        # ft_launcher forks each worker from its own process and runpy-runs the shim there.
        d.args.extend(["--run-path", str(SHIM_PATH), *(["--resctl-module"] if target.module else [])])
    elif launch.use_shim:
        d.args.extend(["--module", SHIM_MODULE, *(["--resctl-module"] if target.module else [])])
    else:
        d.args.extend(["--module"] if target.module else [])
    d.args.extend([target.script, *target.args])
    if target.no_python and launch.use_shim:
        return ["--no-python: the target is not Python, so it runs without resctl.shim"]
    return []


def _environment_section(d: _Draft, p: Profile, rendezvous: Rendezvous, series: str, fork_workers: bool,
                         user_env: Mapping[str, str], rdzv_env: dict[str, str], run_dir: Path) -> None:
    """What the launcher's (and so the workers') environment gets added."""
    launch, env = p.launch, d.env
    env.update(launch.env)
    node_rank = launch.node_rank if launch.node_rank is not None else rendezvous.node_rank
    if node_rank is not None and series != "0.4" and "GROUP_RANK" not in user_env:
        env["GROUP_RANK"] = str(node_rank)  # 0.6+'s barrier rendezvous orders nodes by it
    if fork_workers:
        env[contract.PRELOAD] = "1"
        if "PYTHONUNBUFFERED" not in user_env:  # what `python -u` gives exec'd workers, less the variable
            env["PYTHONUNBUFFERED"] = "1"
            env[ADDED_ENV] = "PYTHONUNBUFFERED"  # a forked worker drops it again (shim/forked.py)
    # The workers' MASTER_ADDR/MASTER_PORT are the rendezvous store's (adapters._agent_store).
    if "TORCHELASTIC_SIGNALS_TO_HANDLE" not in user_env:
        env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = TORCHRUN_SIGNALS
    env.update(rdzv_env)
    env[contract.RUN_DIR] = str(run_dir)
    env[contract.PLAN] = str(run_dir / PLAN_FILE)
    env.update(inprocess_env(p, {**user_env, **env}))


def _resctl_section(d: _Draft, p: Profile, rendezvous: Rendezvous) -> int | None:
    """What the `resctl run` process itself does: fault drills, metrics, the replica server (its port)."""
    if p.faults.schedule:
        d.notes.append(
            "FAULT DRILL ON: " + ", ".join(f"{f.kind}@step {f.step} rank {f.rank}" for f in p.faults.schedule)
            + f" ({d.src('faults.schedule')})"
        )
    launch = p.launch
    if launch.metrics_port is not None:
        d.settings.append(("(resctl) metrics port", str(launch.metrics_port), d.src("launch.metrics_port")))
        d.settings.append(("(resctl) metrics address", launch.metrics_addr, d.src("launch.metrics_addr")))
    replica_port = _replica_port(p, rendezvous)
    if replica_port is not None:
        d.settings.append(("(resctl) memory replica port", str(replica_port) if replica_port else "any free",
                           d.src("checkpoint.memory_replicate_port")))
    return replica_port


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
    if not ck.memory_every or not ck.memory_replicate or rendezvous.node_range(p.launch).max < 2:
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

