"""The contract between resctl's processes, in one place: the `RESCTL_*` environment variables that
`resctl run`, the launcher, the workers' shim and the scheduler kits hand each other, and the run
directory's files that cross process lines (`plan.json`: the resolved profile every process reads;
`fatal.json`: why a job stopped instead of restarting).

Every process reads them through this module: a name is spelt once (`ENV` documents each, and a test
fails on a `"RESCTL_..."` literal elsewhere), and plan.json is parsed once (`read_plan`), with its
sections typed here (`health_limits`, `planned_checkpoint`) and their defaults the schema's.
A profile key's own environment override (`RESCTL_LAUNCH_NNODES`, ...) is not part of it: the schema
derives those from the key (`schema.env_name`).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resctl.redact import redact_text

# --- the environment ------------------------------------------------------------------------------

RUN_DIR = "RESCTL_RUN_DIR"
PLAN = "RESCTL_PLAN"
PRELOAD = "RESCTL_PRELOAD"
ADDED_ENV = "RESCTL_ADDED_ENV"
VERBOSE = "RESCTL_VERBOSE"
DEBUG = "RESCTL_DEBUG"
PROFILE = "RESCTL_PROFILE"
FAULTS = "RESCTL_FAULTS"
STOP_FILE = "RESCTL_STOP_FILE"
JOB_STOP = "RESCTL_JOB_STOP"
RUN_PID = "RESCTL_RUN_PID"
LAUNCHER_PID = "RESCTL_LAUNCHER_PID"
STORE_PREFIX = "RESCTL_STORE_PREFIX"
RDZV = "RESCTL_RDZV"
RDZV_KEEP_ALIVE = "RESCTL_RDZV_KEEP_ALIVE"
RDZV_MISSES = "RESCTL_RDZV_MISSES"
RDZV_STORE = "RESCTL_RDZV_STORE"
SHM_DIR = "RESCTL_SHM_DIR"
SHM_LAUNCH = "RESCTL_SHM_LAUNCH"
REPLICA_ADDR = "RESCTL_REPLICA_ADDR"
REPLICA_HOST = "RESCTL_REPLICA_HOST"
SLURM_REQUEUE_FILE = "RESCTL_SLURM_REQUEUE_FILE"
PRESTART = "RESCTL_PRESTART"
PRESTART_FD = "RESCTL_PRESTART_FD"
RESTART_CLOCK = "RESCTL_RESTART_CLOCK"
#: torch elastic's own name (not resctl's): "True" tells the workers that MASTER_ADDR/MASTER_PORT is the
#: launcher's store (launcher -> workers, as torchrun sets it; `resctl.shim.agent_store` reads it).
AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"

#: Every name, who sets it and what it says (docs/architecture.md points here).
ENV: dict[str, str] = {
    RUN_DIR: "resctl run -> launcher, workers: the run directory",
    PLAN: "resctl run -> launcher, workers: the path of plan.json",
    PRELOAD: "resctl run -> launcher: 1 when workers are forked (preload torch and the shim before them)",
    ADDED_ENV: "resctl run -> launcher: comma list of variables set for the launcher only (a forked worker unsets them)",
    VERBOSE: "resctl run -v -> launcher: 1 puts the launcher's log on the console too",
    DEBUG: "user -> every command: 1 shows tracebacks",
    PROFILE: "user -> resctl run, profile: the profile file when no -p is given",
    FAULTS: "user -> resctl run: a fault-drill schedule (faults.schedule)",
    STOP_FILE: "launcher -> workers: the file naming the workers it stops for a restart",
    JOB_STOP: "launcher -> workers: a job stop arrived during a restart (begin it at once)",
    RUN_PID: "resctl run -> launcher: its PID (the launcher dies with it)",
    LAUNCHER_PID: "launcher -> workers: its PID (a worker dies with it)",
    STORE_PREFIX: "launcher -> workers: this round's key space in the rendezvous store",
    RDZV: "resctl run -> launcher: 'resctl' selects resctl's rendezvous",
    RDZV_KEEP_ALIVE: "resctl run -> launcher: resctl's rendezvous keep-alive interval (seconds)",
    RDZV_MISSES: "resctl run -> launcher: keep-alives a node may miss before it is lost",
    RDZV_STORE: "resctl run -> launcher: where the rendezvous store lives (launch.store: node or external)",
    SHM_DIR: "user -> workers: where the memory tier's /dev/shm tree goes",
    SHM_LAUNCH: "resctl run -> workers: this launch's suffix of the memory tier's tree",
    REPLICA_ADDR: "resctl run -> workers: host:port of this node's replica server",
    REPLICA_HOST: "user -> resctl run: the host the replica server advertises",
    SLURM_REQUEUE_FILE: "examples/slurm/train.sbatch -> resctl run: ask the batch script to requeue the job",
    PRESTART: "user -> resctl run: 0 starts the launcher's interpreter only once the plan is made (resctl.launch.prestart)",
    PRESTART_FD: "resctl run -> its waiting launcher: the pipe the plan comes on (resctl.launch.prestart)",
    RESTART_CLOCK: "launcher -> a restarted cycle's workers: '<detected>,<stopped>', the unix times it saw the "
                   "cycle before fail and had stopped its workers (the start event's `detected` and `stopped`)",
}


def restart_clock_value(detected: float, stopped: float) -> str:
    """`RESTART_CLOCK`'s value (`restart_clock` reads it)."""
    return f"{detected:.3f},{stopped:.3f}"


def restart_clock(env: Mapping[str, str]) -> tuple[float, float] | None:
    """`RESTART_CLOCK` read: (detected, stopped), None where unset or not two times."""
    try:
        detected, stopped = (float(x) for x in env.get(RESTART_CLOCK, "").split(","))
    except ValueError:
        return None
    return detected, stopped


@dataclass(frozen=True)
class Handed:
    """What `resctl run` hands the launcher and the workers, typed (None / False: not set)."""

    run_dir: Path | None
    plan: Path | None
    preload: bool
    verbose: bool
    debug: bool

    @classmethod
    def of(cls, env: Mapping[str, str] | None = None) -> Handed:
        env = os.environ if env is None else env
        return cls(run_dir=Path(env[RUN_DIR]) if env.get(RUN_DIR) else None,
                   plan=Path(env[PLAN]) if env.get(PLAN) else None,
                   preload=env.get(PRELOAD) == "1", verbose=env.get(VERBOSE) == "1", debug=env.get(DEBUG) == "1")


# --- plan.json ----------------------------------------------------------------------------------

PLAN_FILE = "plan.json"


def read_plan(path: Path) -> dict[str, Any] | None:
    """A run's plan.json as a dict whose "profile" is a dict, or None when it is missing, unreadable or damaged.

    For readers that can do without it (`resctl report`, `tune-interval`, the metrics endpoint, the
    health gate): a hand-edited or truncated plan.json must not crash them.
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


def _section(plan: Mapping[str, Any] | None, name: str) -> Mapping[str, Any] | None:
    profile = plan.get("profile") if isinstance(plan, Mapping) else None
    section = profile.get(name) if isinstance(profile, Mapping) else None
    return section if isinstance(section, Mapping) else None


def late_preload(plan: Mapping[str, Any] | None) -> str:
    """plan.json's `launch.late_preload` ("auto" where absent or not one of the schema's values)."""
    section = _section(plan, "launch")
    value = section.get("late_preload") if section is not None else None
    return value if value in ("at-once", "late", "after-restart") else "auto"


def standby(plan: Mapping[str, Any] | None) -> str:
    """plan.json's `launch.standby` ("auto" where absent or not one of the schema's values)."""
    section = _section(plan, "launch")
    value = section.get("standby") if section is not None else None
    return value if value in ("on", "off") else "auto"


@dataclass(frozen=True)
class CheckpointPlan:
    """What plan.json says of the job's saves (None: absent or not valid: the run's events decide)."""

    interval_steps: int | None = None
    async_: bool | None = None
    memory_every: int | None = None


def planned_checkpoint(plan: Mapping[str, Any] | None) -> CheckpointPlan:
    """plan.json's `[checkpoint]` interval_steps, async and memory_every, each None where absent or not valid."""
    section = _section(plan, "checkpoint")
    if section is None:
        return CheckpointPlan()
    interval = section.get("interval_steps")
    mode = section.get("async")
    memory = section.get("memory_every")
    return CheckpointPlan((interval if type(interval) is int and interval > 0 else None),
                          (mode if isinstance(mode, bool) else None),
                          (memory if type(memory) is int and memory > 0 else None))


@dataclass(frozen=True)
class HealthLimits:
    """The launcher's health gate: restarts without progress, faults of one node, and what keeps a bad
    node out (0 / "off": that limit is off)."""

    no_progress_cycles: int = 0
    node_fault_limit: int = 0
    keep_out: str = "off"


def health_limits(plan: Mapping[str, Any] | None) -> HealthLimits:
    """plan.json's `[health]` limits, a key it lacks taking the schema's default; all off when the file
    or the section is damaged."""
    section = _section(plan, "health")
    if section is None:
        return HealthLimits()
    # Here, not at the top: the names above are imported by `resctl --help` and every forked worker,
    # which must not pay for pydantic; a plan is read by processes that have it loaded already.
    from resctl.profile.schema import Health

    defaults = Health()
    try:
        return HealthLimits(int(section.get("no_progress_cycles", defaults.no_progress_cycles)),
                            int(section.get("node_fault_limit", defaults.node_fault_limit)),
                            str(section.get("keep_out", defaults.keep_out)))
    except (ValueError, TypeError, OverflowError):  # OverflowError: a hand-edited `Infinity` or 1e999
        return HealthLimits()


def plan_from_env(env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The plan.json `resctl run` handed this process (None: none, or damaged)."""
    path = Handed.of(env).plan
    return None if path is None else read_plan(path)


# --- fatal.json ---------------------------------------------------------------------------------

FATAL_FILE = "fatal.json"  # in the run directory: a worker's reason to stop the job instead of restarting it


def record_fatal(run_dir: Path, record: dict[str, Any]) -> None:
    """Write fatal.json once per run: complete before it is visible, first writer wins (a rank stopped
    mid-write by another rank's SIGTERM to the launcher must not leave an empty reason behind).
    `record` holds `exit_code` and `error`, and `rank` (a worker's) or `cause` (`resctl run`'s own,
    e.g. no_progress from the health watch)."""
    if isinstance(record.get("error"), str):  # an exception's text may quote a URL with its token
        record = {**record, "error": redact_text(record["error"])}
    tmp = run_dir / f".{FATAL_FILE}.{os.getpid()}.{threading.get_ident()}"
    try:
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.link(tmp, run_dir / FATAL_FILE)
    except OSError:
        pass  # another rank said it first (or the run dir is gone): one reason is enough
    finally:
        tmp.unlink(missing_ok=True)


def read_fatal(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((run_dir / FATAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("exit_code"), int) else None
