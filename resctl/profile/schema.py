"""The profile schema: every key, its type, default and documentation live here and only here.

`resctl profile init`, `resctl profile show`, the README's profile reference and the
`RESCTL_<SECTION>_<KEY>` environment names are all generated from these models.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic.fields import FieldInfo

from resctl import slots  # pure facts of the memory tier (imports nothing)
from resctl.drills import FaultKind
from resctl.errors import UsageError
from resctl.profile.nvrx_versions import series_for
from resctl.profile.units import parse_duration


def _optional_duration(value: object) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in {"none", "off", ""}):
        return None
    return parse_duration(value)


def _int_to_str(value: object) -> object:
    # TOML users write `nnodes = 2` as often as `nnodes = "2:4"`.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


IntOrStr = Annotated[str, BeforeValidator(_int_to_str)]

# --- launcher rules: what ft_launcher (and the rendezvous) accept, checked here so that
# `profile validate` and `run` refuse exactly the same profiles.
PSEUDO_FS = ("/proc", "/sys", "/dev")
_NNODES = re.compile(r"^\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?$", re.ASCII)
_STD = re.compile(r"^[0-3]$|^([0-9]:[0-3],)*([0-9]:[0-3])$", re.ASCII)  # torch elastic's Std.from_str
_NPROC = re.compile(r"^[1-9][0-9]{0,5}$|^(auto|cpu|gpu)$", re.ASCII)
_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$", re.ASCII)
_CONF_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$", re.ASCII)
_VERSION = re.compile(r"^v?[0-9]+\.[0-9]+(\.[0-9]+)?([.+-]?[A-Za-z0-9.+-]*)?$", re.ASCII)


class NodeRange(NamedTuple):
    """launch.nnodes parsed: "4" is (4, 4), "2:4" is (2, 4)."""

    min: int
    max: int


class Endpoint(NamedTuple):
    """A rendezvous endpoint parsed: "HOST[:PORT]" or "[IPV6]:PORT"."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def nnodes_range(nnodes: str) -> NodeRange:
    """(MIN, MAX) of "4" or "2:4". Raises ValueError unless 0 < MIN <= MAX."""
    match = _NNODES.match(nnodes)
    if not match:
        raise ValueError(f"{nnodes!r} is not a number of nodes or a range MIN:MAX")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if not 0 < low <= high:
        raise ValueError(f"{nnodes!r}: expected 0 < MIN <= MAX")
    return NodeRange(low, high)


def split_endpoint(value: str, default_port: int) -> Endpoint:
    """(host, port) of "HOST[:PORT]" or "[IPV6]:PORT". Raises ValueError saying what is wrong."""
    value = value.strip()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if rest and not rest.startswith(":"):
            raise ValueError("expected HOST:PORT")
    elif value.count(":") == 1:
        host, port_text = value.split(":")
    elif ":" in value:
        raise ValueError("write an IPv6 address as [ADDR]:PORT")
    else:
        host, port_text = value, ""
    if not host or any(ch.isspace() or ch in "/@," for ch in host):
        raise ValueError("the host is missing or not a host name (expected HOST:PORT)")
    if not port_text:
        return Endpoint(host, default_port)
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > 65535:
        raise ValueError("the port must be a number from 0 to 65535")
    return Endpoint(host, int(port_text))


def nvrx_series(version: str) -> str:
    """The ft_launcher series ("0.4", "0.6+") of a version; ValueError for one resctl cannot plan for."""
    if not _VERSION.fullmatch(version.strip()):
        raise ValueError(f"{version!r} is not a version; use auto or a version such as 0.4.1 or 0.7.0")
    try:
        return series_for(version)
    except UsageError as err:
        raise ValueError(str(err)) from None


def _check_nnodes(value: str) -> str:
    nnodes_range(value)
    return value.strip()


def _check_std(value: str) -> str:
    if not _STD.fullmatch(value):
        raise ValueError(f"{value!r}: use 0 (none), 1 (stdout), 2 (stderr), 3 (both), or per local rank 0:3,1:0")
    return value


def _check_nproc(value: str) -> str:
    if not _NPROC.fullmatch(value.strip()):
        raise ValueError(f"{value!r}: use a number of workers (1 or more), or auto, cpu, gpu")
    return value.strip()


def _check_endpoint(value: str) -> str:
    if value.strip().lower() != "auto":
        split_endpoint(value, 0)
    return value.strip()


def _check_run_id(value: str) -> str:
    if value.strip().lower() not in {"auto", "none", ""} and not _RUN_ID.fullmatch(value.strip()):
        raise ValueError(f"{value!r}: a run id names a directory; use letters, digits, '.', '_' and '-' "
                         "(up to 128, starting with a letter or digit), or auto")
    return value.strip()


def _check_version(value: str) -> str:
    if value.strip() != "auto":
        nvrx_series(value)
    return value.strip()


def _check_path(value: str) -> str:
    if "\x00" in value:
        raise ValueError("a path cannot contain a NUL character")
    if value and not value.strip():
        raise ValueError("a path of only spaces; give a directory, or leave it empty where that means the default")
    normal = "/" + value.strip().strip("/")
    if value.startswith("/") and any(normal == fs or normal.startswith(fs + "/") for fs in PSEUDO_FS):
        raise ValueError(f"{value!r} is on a kernel pseudo-filesystem ({', '.join(PSEUDO_FS)}); "
                         "give a directory on real storage")
    return value


def _check_addr(value: str) -> str:
    try:
        ipaddress.ip_address(value.strip())
    except ValueError:
        raise ValueError(f"{value!r} is not an IP address; use 0.0.0.0 (all interfaces), :: or 127.0.0.1") from None
    return value.strip()


def _not_empty(value: str) -> str:
    if not value:
        raise ValueError("cannot be empty (it would put the run's files into the working directory); "
                         "give a directory such as resctl-runs/{run_id}")
    return value


def _check_env(value: dict[str, str]) -> dict[str, str]:
    for name, text in value.items():
        if not name or "=" in name or "\x00" in name:
            raise ValueError(f"{name!r} is not an environment variable name (no '=', no NUL, not empty)")
        if "\x00" in text:
            raise ValueError(f"the value of {name} contains a NUL character, which an environment cannot hold")
    return value


def _check_conf(value: dict[str, str]) -> dict[str, str]:
    for key, text in value.items():
        if not _CONF_KEY.fullmatch(key):
            raise ValueError(f"{key!r} is not a rendezvous setting name (letters, digits, '_')")
        if "," in text or "\x00" in text:
            raise ValueError(f"the value of {key} cannot contain ',' or NUL (ft_launcher splits settings on ',')")
    return value


Nnodes = Annotated[str, BeforeValidator(_int_to_str), AfterValidator(_check_nnodes)]
NprocPerNode = Annotated[str, BeforeValidator(_int_to_str), AfterValidator(_check_nproc)]
StdSpec = Annotated[str, BeforeValidator(_int_to_str), AfterValidator(_check_std)]
Path_ = Annotated[str, AfterValidator(_check_path)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(json_schema_extra={"unit": "duration"})]
OptionalDuration = Annotated[
    float | None, BeforeValidator(_optional_duration), Field(json_schema_extra={"unit": "duration"})
]


class Section(BaseModel):
    # allow_inf_nan=False: `timeout = nan` would turn hang detection off, `inf` overflows the launcher.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        # No profile string reaches a path, an argv or an environment with a NUL in it.
        texts = [value] if isinstance(value, str) else [*value.keys(), *value.values()] if isinstance(value, dict) else []
        for text in texts:
            if isinstance(text, str) and "\x00" in text:
                raise ValueError("contains a NUL character; remove it")
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # os.environ keeps undecodable bytes as lone surrogates
                    raise ValueError("contains bytes that are not UTF-8 text; write it in UTF-8") from None
        return value


class Launch(Section):
    """How ft_launcher starts and restarts the workers (torchrun's flags)."""

    nnodes: Nnodes = Field("1", description="Number of nodes, or a range MIN:MAX (torchrun --nnodes).")
    nproc_per_node: NprocPerNode = Field("1", description="Workers per node: a number, or auto, gpu, cpu (torchrun --nproc-per-node).")
    node_rank: int | None = Field(None, ge=0, description="This node's rank; unset lets the rendezvous assign it.")
    max_restarts: int = Field(3, ge=0, description="In-job restarts of the worker group before the job fails.")
    rdzv_backend: Literal["c10d"] = Field("c10d", description="Rendezvous backend (ft_launcher supports c10d only).")
    rdzv_endpoint: Annotated[str, AfterValidator(_check_endpoint)] = Field(
        "auto",
        description="HOST:PORT of the rendezvous, or auto: Kubernetes Indexed Job, PyTorchJob, Slurm, else standalone.",
    )
    rdzv_port: int = Field(29500, ge=1, le=65535, description="Rendezvous port used when the host is detected.")
    rdzv_id: Annotated[str, AfterValidator(_check_run_id)] = Field("auto", description="Job id shared by all nodes; auto derives it from the scheduler or a fresh id.")
    rdzv_conf: Annotated[dict[str, str], AfterValidator(_check_conf)] = Field(default_factory=dict, description="Extra rendezvous settings (key = value).")
    standalone: bool = Field(False, description="Single-node rendezvous on a free local port (torchrun --standalone).")
    store: Literal["node", "external"] = Field(
        "node", description="Where the rendezvous store lives. node: with the launcher of the node with is_host (torchrun's "
        "and NVRx's way; that node lost, the job is lost), served by a process the launcher forks before its first "
        "thread (resctl.launch.store_keeper). external: in a `resctl store` process that trains nothing, "
        "at launch.rdzv_endpoint; every node connects as a client (is_host = 0), so any node may be lost "
        "(docs/recovery.md, issue 42).",
    )
    k8s_service: str = Field(
        "", description="Headless Service of the Indexed Job; rank 0 is <job>-0.<service>.<namespace>.svc.cluster.local."
    )
    k8s_namespace: str = Field("", description="Namespace of that Service; empty reads the pod's own namespace.")
    master_addr: str = Field("", description="torchrun --master-addr (static rendezvous); empty leaves it to the launcher.")
    master_port: int | None = Field(None, ge=1, le=65535, description="torchrun --master-port (static rendezvous).")
    local_addr: str = Field("", description="Address other nodes reach this node on; empty uses the FQDN.")
    monitor_interval: Duration = Field(5.0, gt=0, description="How often the launcher polls its workers.")
    term_timeout: Duration = Field(60.0, gt=0, description="Grace between SIGTERM and SIGKILL when the launcher is told to stop.")
    workers_stop_timeout: Duration = Field(
        0.5, gt=0, description="Grace between SIGTERM and SIGKILL when the launcher stops workers to restart them "
        "(forked and exec'd alike). resctl's shim leaves at once on such a SIGTERM; this bounds a worker that cannot.",
    )
    rendezvous: Literal["auto", "nvrx", "resctl"] = Field(
        "auto", description="Which rendezvous the launcher's agents meet in, on every NVRx version. resctl: resctl's "
        "(O(1) store requests per node and round; a restart round waits for no lost node that it does not need; "
        "spares, node stop and the cluster preflight read its typed state). auto (the default): resctl's, except "
        "with the min-healthy restart policy (NVRx 0.4 with in-process restart), which needs NVRx's worker states. "
        "nvrx: NVRx's own (0.4: one key holds the whole membership and a restart round after a lost node first "
        "waits 5 s x 3 for its keep-alive to expire; 0.6+: its barrier rendezvous, where resctl cannot decide "
        "after a peer's stop nor hold a preflight spare back). docs/architecture.md, issues 25 and 30.",
    )
    rdzv_keep_alive: Duration = Field(
        1.0, gt=0, description="launch.rendezvous = \"resctl\": how often each node's agent renews its heartbeat in "
        "the rendezvous store (one small write); NVRx's own rendezvous keeps its fixed 5 s.",
    )
    rdzv_keep_alive_misses: int = Field(
        3, ge=1, description="launch.rendezvous = \"resctl\": a node whose heartbeat is this many keep-alive "
        "intervals old counts as gone, and a restart round stops waiting for it (a node whose `resctl run` saw its "
        "launcher die counts as gone at once).",
    )
    restart_policy: Literal["auto", "any-failed", "min-healthy"] = Field(
        "auto", description="auto picks min-healthy on NVRx 0.4 when in-process restart is on, else any-failed."
    )
    start_method: Literal["spawn", "fork", "forkserver"] = Field(
        "fork", description="torchrun's --start-method. fork: workers are forked from the launcher (as worker_start "
        "says); spawn or forkserver: each worker is a fresh interpreter (worker_start = \"exec\" then).",
    )
    worker_start: Literal["fork", "exec"] = Field(
        "fork",
        description="fork: workers are forked from the launcher, which has imported torch once (in-job restarts in "
        "about a second); exec: each worker is a fresh `python -m resctl.shim` that imports everything anew (torch only "
        "when the script imports it: its hooks go in then, `resctl/shim/on_import.py`).",
    )
    late_preload: Literal["auto", "at-once", "late", "after-restart"] = Field(
        "auto",
        description="worker_start = \"fork\": when the launcher imports what a script imports at its first optimizer "
        "(torch._dynamo, FSDP: 1-3 CPU-s) so that restarted workers are forked with it. at-once: beside the first "
        "workers (a kill in the job's first seconds restarts as fast as a later one; the launcher abandons the import "
        "at the job's end). late: 3 s into the workers' run, once one said its script imported them. after-restart: "
        "the same, only once the job has restarted (a job that never fails never pays for it). auto: at-once where "
        "the node has 2 cores to spare beyond one per local worker (its CPU affinity and cgroup limit), else late.",
    )
    standby: Literal["auto", "on", "off"] = Field(
        "auto",
        description="worker_start = \"exec\": one interpreter per local rank, started beside the workers, imports "
        "torch and what a script imports at its first optimizer, and waits; once a worker has made a step, a restarted "
        "worker starts in it instead of a new interpreter (resctl/launch/standby.py): an exec'd restart without its "
        "imports. Costs one idle interpreter per local rank (host memory, no GPU memory) and its import's CPU once per "
        "worker start. auto: on where the node has 2 cores to spare beyond two per local worker, else off.",
    )
    log_dir: Path_ = Field("", description="Worker log directory (torchrun --log-dir); empty: <run_dir>/logs.")
    redirects: StdSpec = Field("0", description="torchrun -r: redirect worker stdout/stderr into log_dir (0-3 or per rank).")
    tee: StdSpec = Field("0", description="torchrun -t: tee worker stdout/stderr into log_dir and the console.")
    run_dir: Annotated[Path_, AfterValidator(_not_empty)] = Field(
        "resctl-runs/{run_id}", description="Where events, the resolved profile and summaries go; {run_id} is expanded."
    )
    env: Annotated[dict[str, str], AfterValidator(_check_env)] = Field(
        default_factory=dict,
        description="Environment for the launcher and every worker (e.g. FI_PROVIDER = \"efa\"); merges with "
        "RESCTL_LAUNCH_ENV name by name. Values reach the processes only: plan.json keeps the names, and what resctl "
        "prints masks secret-looking ones (docs/security.md)."
    )
    metrics_port: int | None = Field(
        None, ge=0, le=65535,
        description="Serve Prometheus metrics of the run on this port (resctl run process); 0 picks a free port.",
    )
    metrics_addr: Annotated[str, AfterValidator(_check_addr)] = Field(
        "0.0.0.0",
        description="Address the metrics endpoint listens on: 0.0.0.0 (every IPv4 interface, so a pod's Prometheus "
        "scrape of the pod IP reaches it), :: for IPv6, 127.0.0.1 to keep it on the node (docs/security.md).",
    )
    preflight: Literal["off", "cluster"] = Field(
        "off", description="cluster: before the launcher starts, every node meets the others and runs real "
        "collectives (gloo on CPU, NCCL on GPU) in pairs and all together and a matmul per device; slow or broken "
        "nodes are named and, by health.preflight_policy, fail the job or are left out (docs/doctor.md).",
    )
    use_shim: bool = Field(True, description="Start workers through resctl.shim (heartbeats, checkpoints, restarts).")
    nvrx_version: Annotated[str, AfterValidator(_check_version)] = Field("auto", description="NVRx version to plan for; auto reads the installed package.")

    @property
    def node_range(self) -> NodeRange:
        """launch.nnodes as (MIN, MAX), parsed (the validator has checked it)."""
        return nnodes_range(self.nnodes)

    @property
    def endpoint(self) -> Endpoint | None:
        """launch.rdzv_endpoint parsed (its port defaults to launch.rdzv_port); None for "auto"."""
        if self.rdzv_endpoint.lower() == "auto":
            return None
        return split_endpoint(self.rdzv_endpoint, self.rdzv_port)

    @model_validator(mode="after")
    def _launcher_rules(self) -> Launch:
        endpoint_set = self.rdzv_endpoint.lower() != "auto"
        max_nodes = nnodes_range(self.nnodes)[1]
        if self.standalone and (endpoint_set or self.master_addr):
            raise ValueError("launch.standalone = true picks its own local endpoint; unset launch.rdzv_endpoint / "
                             "launch.master_addr, or set launch.standalone = false")
        if self.standalone and max_nodes > 1:
            raise ValueError(f"launch.standalone = true runs one node, but launch.nnodes = {self.nnodes}")
        if endpoint_set:
            host, port = split_endpoint(self.rdzv_endpoint, self.rdzv_port)
            if self.master_addr and self.master_addr != host:
                raise ValueError(f"launch.rdzv_endpoint ({self.rdzv_endpoint}) and launch.master_addr "
                                 f"({self.master_addr}) name different hosts; set only one of them")
            if port == 0 and max_nodes > 1:
                raise ValueError(f"launch.rdzv_endpoint {self.rdzv_endpoint} has port 0, which other nodes "
                                 "cannot reach; give a fixed port")
        if self.store == "external":
            self._external_store_rules(endpoint_set)
        if self.restart_policy == "min-healthy" and self.nvrx_version != "auto" \
                and nvrx_series(self.nvrx_version) != "0.4":
            raise ValueError(f"launch.restart_policy = \"min-healthy\" is not accepted by NVRx {self.nvrx_version} "
                             "(removed in 0.6); use \"any-failed\" or \"auto\"")
        if self.rendezvous == "resctl" and self.restart_policy == "min-healthy":
            raise ValueError("launch.rendezvous = \"resctl\" keeps no worker states, which restart_policy "
                             "\"min-healthy\" needs; use restart_policy = \"any-failed\" or rendezvous = \"nvrx\"")
        return self

    def _external_store_rules(self, endpoint_set: bool) -> None:
        """launch.store = "external": the nodes reach a `resctl store` at launch.rdzv_endpoint, none hosts one."""
        if self.standalone:
            raise ValueError("launch.store = \"external\" needs the `resctl store` endpoint, which launch.standalone = "
                             "true replaces with a local one; set launch.standalone = false")
        if self.rdzv_conf.get("is_host", "").strip().lower() in ("1", "true"):
            raise ValueError("launch.store = \"external\": no node hosts the store, but launch.rdzv_conf sets "
                             "is_host = 1; drop is_host (the plan sets 0 on every node)")
        if not endpoint_set:
            raise ValueError("launch.store = \"external\" connects every node to a `resctl store`: set "
                             "launch.rdzv_endpoint (--rdzv-endpoint) to its HOST:PORT")
        if self.preflight == "cluster":
            raise ValueError("launch.preflight = \"cluster\" meets on the store host's launcher, which "
                             "launch.store = \"external\" has none of; set launch.preflight = \"off\" (or store = \"node\")")
        if split_endpoint(self.rdzv_endpoint, self.rdzv_port)[1] == 0:
            raise ValueError(f"launch.store = \"external\": launch.rdzv_endpoint {self.rdzv_endpoint} has port 0; "
                             "give the port `resctl store --listen` serves on")


class Heartbeat(Section):
    """Hang detection by the NVRx rank monitors (ft_launcher --ft-* settings)."""

    initial_timeout: OptionalDuration = Field(1200.0, description="Time allowed for a rank's first heartbeat (startup, first step).")
    timeout: OptionalDuration = Field(900.0, description="Time allowed between heartbeats before a rank counts as hung.")
    check_interval: Duration = Field(5.0, gt=0, description="How often the rank monitors check heartbeats.")
    sections: dict[str, Duration] = Field(
        default_factory=dict, description="Timeouts of named sections (e.g. checkpoint = \"30m\")."
    )
    out_of_section_timeout: OptionalDuration = Field(None, description="Timeout outside any section; none disables it.")
    safety_factor: float = Field(5.0, gt=0, description="Multiplier NVRx applies to observed intervals when it computes timeouts.")
    termination_signal: Literal["SIGKILL", "SIGTERM", "SIGINT", "SIGABRT"] = Field(
        "SIGKILL", description="Signal sent to a rank found hung."
    )
    node_health_check_interval: Duration = Field(5.0, gt=0, description="How often the node health check runs.")
    nic_monitor: bool = Field(False, description="NVRx NIC link monitoring (needs a PCI topology; off on CPU).")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="Log level of the NVRx monitors.")


class InProcess(Section):
    """NVRx in-process restart: ranks re-enter the script in the same interpreter after a fault."""

    enabled: bool = Field(False, description="Wrap the script in NVRx inprocess.Wrapper.")
    soft_timeout: Duration = Field(60.0, gt=0, description="No progress for this long raises a hang in the rank.")
    hard_timeout: Duration = Field(90.0, gt=0, description="No progress for this long terminates the rank.")
    barrier_timeout: Duration = Field(120.0, gt=0, description="Time allowed for all ranks to meet between restarts.")
    completion_timeout: Duration = Field(120.0, gt=0, description="Time allowed for all ranks to finish together.")
    heartbeat_timeout: Duration = Field(30.0, gt=0, description="A rank missing its wrapper heartbeats this long is dead.")
    monitor_interval: Duration = Field(1.0, gt=0, description="Wrapper monitor thread/process poll interval.")
    progress_interval: Duration = Field(1.0, gt=0, description="How often the progress watchdog samples.")
    last_call_wait: Duration = Field(1.0, ge=0, description="Time to collect concurrent faults before restarting.")
    termination_grace_time: Duration = Field(5.0, ge=0, description="Grace between SIGTERM and SIGKILL of a hung rank.")
    max_iterations: int | None = Field(None, ge=1, description="In-process restarts before handing over to the launcher.")
    max_rank_faults: int | None = Field(None, ge=1, description="Faults one rank may have before it is excluded.")
    min_world_size: int | None = Field(
        None, ge=1, description="Fewest ranks an in-process restart may continue with; empty: every rank (a lost "
        "rank falls through to the launcher). A smaller value is announced and recorded as an event.",
    )
    fresh_state: bool = Field(
        True, description="Before each in-process restart, put back the process state a new worker starts with "
        "(global RNGs, CUDA generators, DTensor's RNG tracker, TorchDynamo caches), so a restart is exact; "
        "false only to diagnose (docs/recovery.md).",
    )
    health_check: bool = Field(True, description="Run NVRx's CUDA health check between iterations (skipped without CUDA).")

    @model_validator(mode="after")
    def _ordered(self) -> InProcess:
        if not self.soft_timeout < self.hard_timeout < self.barrier_timeout:
            raise ValueError(
                "soft_timeout < hard_timeout < barrier_timeout must hold "
                f"(got {self.soft_timeout:g}s, {self.hard_timeout:g}s, {self.barrier_timeout:g}s)"
            )
        # NVRx enforces these too, but only when a worker starts; say so before launch.
        for short, long_ in (("monitor_interval", "soft_timeout"), ("progress_interval", "soft_timeout"),
                             ("heartbeat_timeout", "barrier_timeout"), ("monitor_interval", "heartbeat_timeout")):
            if getattr(self, short) >= getattr(self, long_):
                raise ValueError(f"{short} ({getattr(self, short):g}s) must be shorter than {long_} "
                                 f"({getattr(self, long_):g}s)")
        return self


class Checkpoint(Section):
    """resctl.checkpoint: async, atomic, verified checkpoints."""

    dir: Path_ = Field("checkpoints", description="Checkpoint directory (shared storage, e.g. FSx for Lustre, on a cluster).")
    interval_steps: int = Field(100, ge=1, description="maybe_save() saves every this many optimizer steps.")
    async_: bool = Field(True, alias="async", description="Return once the state is staged; write in the background.")
    memory_every: int = Field(
        0, ge=0, description="Also snapshot the state every this many steps into host shared memory (/dev/shm) that "
        "outlives a killed worker; a restart restores from it when it is newer than the disk (0: off). Needs "
        f"{slots.LOCAL_COPIES}x the state per rank in /dev/shm.",
    )
    memory_replicate: bool = Field(
        True, description="With memory_every > 0 and more than one node: also copy each node's newest memory snapshot "
        "into the host memory of a buddy node (the next node rank) over the job's network, so a lost node restores "
        f"from its buddy instead of the disk. Needs {slots.BUDDY_COPIES}x the state per rank in the buddy's /dev/shm too.",
    )
    memory_replicate_port: int = Field(
        0, ge=0, le=65535, description="TCP port of each node's replica server (started by resctl run; its address "
        "goes to the workers in RESCTL_REPLICA_ADDR); 0: any free port. Open it between nodes.",
    )
    keep_last: int = Field(2, ge=1, description="Complete checkpoints kept; older ones are pruned after a newer one lands.")
    keep_quarantined: int = Field(
        3, ge=0, description="Damaged checkpoints kept in <dir>/.quarantine/ for inspection; older ones are deleted when "
        "another is moved there (0: delete at once).",
    )
    writers: int = Field(4, ge=1, le=64, description="Parallel writer threads per rank.")
    stage: Literal["host", "device"] = Field(
        "host",
        description="Where a save snapshots CUDA tensors before returning: host (pinned memory; blocks for the "
        "device-to-host copy) or device (spare GPU memory the size of the state; blocks ~100x less).",
    )
    recycle: bool = Field(
        True,
        description="Overwrite a pruned checkpoint's files in place for the next write instead of deleting them "
        "(no TRIM wait on disks mounted with discard, no new blocks); false: delete.",
    )
    max_failed_saves: int = Field(
        3, ge=1, description="A failed checkpoint write (full disk, I/O error, permissions) is reported and retried at "
        "the next interval; this many failures in a row stop the job with their cause (1: stop at the first).",
    )
    intercept_torch_save: str = Field(
        "", description="Glob of paths whose torch.save becomes an async atomic save (zero-edit checkpointing)."
    )
    data_position: bool = Field(
        False, description="Save where every DataLoader of the script stands in each checkpoint (epoch, batches "
        "consumed, sampler and RNG state) and resume mid-epoch on the batch the uninterrupted run would have seen "
        "next, without loading the skipped samples (zero-edit; a loader in the checkpoint state is saved either "
        "way). See docs/checkpoint.md, \"Data position\".",
    )
    save_on_sigterm: bool = Field(True, description="On SIGTERM, write a final checkpoint within the grace period.")
    sigterm_grace: Duration = Field(30.0, gt=0, description="Time the SIGTERM save may take (the ranks agree on its step within half of it).")


class Doctor(Section):
    """What `resctl doctor` expects of a node; unset keys take the instance type's defaults."""

    instance_type: str = Field(
        "", description="Instance type whose defaults apply (p5.48xlarge, p5e.48xlarge, p5en.48xlarge, p4d.24xlarge, "
        "p4de.24xlarge); empty: the node's DMI product name."
    )
    gpus: int | None = Field(None, ge=0, description="Expected GPUs on the node.")
    gpu_model: str = Field("", description="Text the GPU name must contain (e.g. H100); empty: any model.")
    nvlinks_per_gpu: int | None = Field(None, ge=0, description="Expected active NVLinks per GPU.")
    efa_devices: int | None = Field(None, ge=0, description="Expected EFA/InfiniBand devices.")
    min_storage_gbps: float | None = Field(None, ge=0, description="Minimum checkpoint-dir write throughput in GB/s.")
    checkpoint_size_gb: float | None = Field(
        None, ge=0, description="Checkpoint size per node in GB: sets the free space, host memory and throughput needed."
    )
    checkpoint_every: OptionalDuration = Field(
        None, description="Wall time between checkpoints; with checkpoint_size_gb, a write must finish within it."
    )
    min_shm_gb: float = Field(1.0, ge=0, description="Minimum /dev/shm size in GB.")
    storage_test_mb: int = Field(
        1024, ge=0, description="Data the storage probe writes, fsyncs and reads back (MB); 0 skips the throughput test."
    )
    timeout: Duration = Field(
        10.0, gt=0, description="Time one probe may take before it counts as hung (storage and --deep get 6x)."
    )
    dns_wait: Duration = Field(
        0.0, ge=0, description="How long the dns probe waits for the rendezvous host to resolve (Kubernetes publishes "
        "rank 0's name only once its pod has an address); 0 checks once."
    )


class Health(Section):
    """Cluster health that acts (docs/recovery.md, "Health"; docs/doctor.md, "Cluster preflight"): restarts that
    make no progress stop the job, ranks slower than the others are named (both from the events the workers
    already write: no per-step cost), the cluster preflight's verdicts are acted on."""

    no_progress_cycles: int = Field(
        3, ge=0,
        description="Stop the job (exit 93, as NVRx >= 0.6: do not requeue) once this many launcher cycles in a "
        "row, the first included, ended without a step beyond the best step before them, instead of spending "
        "every restart (NVRx >= 0.6's default, 3; resctl counts steps from the events, so NVRx's own "
        "checkpoint-file count is turned off); 0: off (restarts stop only at launch.max_restarts).",
    )
    stragglers: bool = Field(
        True, description="Name a rank whose recent step times stay slower than the other ranks' median "
        "(console, a straggler event, `resctl report`, metrics).",
    )
    straggler_margin: float = Field(
        0.5, gt=0, le=100,
        description="How much slower than the median of the other ranks counts: 0.5 = 50 % longer steps.",
    )
    straggler_steps: int = Field(
        20, ge=2, le=100000,
        description="Consecutive steps a rank must stay beyond the margin before it is named (once per episode).",
    )
    preflight_policy: Literal["fail", "exclude", "warn"] = Field(
        "fail", description="What a cluster preflight that names slow or broken nodes does: fail (every node exits "
        "1), exclude (those nodes exit 94 and the others train, when enough are left for launch.nnodes' minimum; "
        "else fail), warn (name them and train on all).",
    )
    preflight_margin: float = Field(
        0.5, gt=0, le=100, description="A node is slow when its matmul rate or its links' bandwidth is worse than "
        "the other nodes' median by this much (0.5: 1.5x slower).",
    )
    preflight_min_gbps: float | None = Field(
        None, gt=0, description="Lowest bandwidth (GB/s) a link between two nodes may have; also judges the one "
        "link of a two-node job, where no median of other nodes exists. Empty: only relative to the others.",
    )
    preflight_mb: int = Field(0, ge=0, le=4096, description="MB each bandwidth test sends; 0: 8 on CPU (gloo), 256 on GPU (NCCL).")
    preflight_timeout: Duration = Field(
        60.0, gt=0, description="Time the nodes have to meet for the preflight; a node that has not joined by then "
        "is named broken.",
    )
    preflight_port: int = Field(0, ge=0, le=65535, description="Port of the preflight's store on the rendezvous host; 0: launch.rdzv_port + 1.")
    keep_out: Literal["off", "auto", "slurm", "kubernetes"] = Field(
        "off", description="Keep a bad node (named by the cluster preflight, or with health.node_fault_limit faults "
        "in this job) out of the next placement: Slurm drains it and requeues the job, Kubernetes labels and taints "
        "it (needs the kit's RBAC); auto picks by the environment (docs/recovery.md, \"Health -> placement\").",
    )
    node_fault_limit: int = Field(
        0, ge=0, le=1000, description="Launcher cycles this node may end by its own fault (its worker died first, "
        "or without a word) before it is kept out (health.keep_out) and its launcher stops; 0: off.",
    )


class Fault(Section):
    """One scheduled fault: fires once per run, at `step` on `rank`."""

    kind: FaultKind
    step: int = Field(ge=1)
    rank: int = Field(0, ge=0)


class Faults(Section):
    """Fault drills: a deterministic schedule (off unless listed)."""

    schedule: list[Fault] = Field(
        default_factory=list, description="Faults to inject, e.g. [{kind = \"sigkill\", step = 30, rank = 1}]."
    )


class Profile(Section):
    """A resolved resctl profile."""

    launch: Launch = Field(default_factory=Launch)
    heartbeat: Heartbeat = Field(default_factory=Heartbeat)
    inprocess: InProcess = Field(default_factory=InProcess)
    checkpoint: Checkpoint = Field(default_factory=Checkpoint)
    doctor: Doctor = Field(default_factory=Doctor)
    health: Health = Field(default_factory=Health)
    faults: Faults = Field(default_factory=Faults)

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        hb, inproc = self.heartbeat, self.inprocess
        if inproc.enabled and hb.timeout is not None and hb.timeout <= inproc.soft_timeout:
            raise ValueError(
                f"heartbeat.timeout ({hb.timeout:g}s) must be longer than inprocess.soft_timeout "
                f"({inproc.soft_timeout:g}s): otherwise the launcher kills a hung rank that in-process restart "
                "was about to recover"
            )
        for name in ("timeout", "initial_timeout"):
            value = getattr(hb, name)
            if value is not None and value <= hb.check_interval:
                raise ValueError(
                    f"heartbeat.{name} ({value:g}s) must be longer than heartbeat.check_interval "
                    f"({hb.check_interval:g}s), or the monitors cannot tell a hang from a slow check"
                )
        return self


SECTIONS: dict[str, type[Section]] = {
    name: info.annotation  # type: ignore[misc]
    for name, info in Profile.model_fields.items()
}


def is_duration(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get("unit") == "duration"


def key_name(section: str, field: str) -> str:
    """The key as written in TOML (aliases such as checkpoint.async included)."""
    info = SECTIONS[section].model_fields[field]
    return info.alias or field


def keys() -> dict[str, tuple[str, str]]:
    """'section.key' (TOML spelling) -> (section, python field name), for every key."""
    out: dict[str, tuple[str, str]] = {}
    for section, model in SECTIONS.items():
        for field in model.model_fields:
            out[f"{section}.{key_name(section, field)}"] = (section, field)
    return out


ENV_PREFIX = "RESCTL_"  # every variable of resctl's: a key's override here, the rest in resctl.profile.contract


def env_name(dotted: str) -> str:
    """'launch.nproc_per_node' -> 'RESCTL_LAUNCH_NPROC_PER_NODE'."""
    return ENV_PREFIX + dotted.replace(".", "_").upper()
