"""Every private name of NVRx and torch that resctl's launcher touches, with the NVRx releases each was
checked on. A release that renames one breaks the launcher silently; this list makes it loud:
`tests/unit/test_nvrx_private.py` fails when the installed NVRx (CI runs both 0.4.1 and 0.7.0) lacks
one, and `resctl.launch.ft_entry` refuses to start a launcher that lacks one (exit 2, before any worker).

Which code uses each: `resctl.launch.agent` (the agent's seams and state), `resctl.launch.adapters`
(what cannot be a method of the agent). Public names (`LocalElasticAgent`, `RankMonitorServer.run`,
`get_args_parser`, `ProcessContext.join`) are not listed; a change there fails at import or in the tests.
"""

from __future__ import annotations

import importlib
import inspect
import re
from dataclasses import dataclass

LAUNCHER = "nvidia_resiliency_ext.fault_tolerance.launcher"
#: NVRx 0.4/0.5 carry their own copy of torch elastic; 0.6+ use torch's.
COMPAT_MP = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing.api"
TORCH_MP = "torch.distributed.elastic.multiprocessing.api"
COMPAT_RDZV = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.api"
COMPAT_API = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server.api"
FT_RDZV = "nvidia_resiliency_ext.fault_tolerance._ft_rendezvous"
BOTH = ("0.4.1", "0.7.0")


@dataclass(frozen=True)
class Private:
    """One private name: `owner` ("module:Class" or "module"), the name, how it is used, and where.

    Attributes:
        kind: "method" or "attribute" (looked up on the owner), "instance" (assigned as `self.NAME`
            in the owner's code: an instance attribute the agent reads or writes).
        series: the ft_launcher series ("0.4", "0.6+") whose code has it; both when ("0.4", "0.6+").
        checked: NVRx releases it was verified on.
    """

    owner: str
    name: str
    kind: str
    why: str
    series: tuple[str, ...] = ("0.4", "0.6+")
    checked: tuple[str, ...] = BOTH

    @property
    def label(self) -> str:
        return f"{self.owner.rsplit('.', 1)[-1]}.{self.name}"


def _agent(name: str, kind: str, why: str) -> Private:
    return Private(f"{LAUNCHER}:LocalElasticAgent", name, kind, why)


def _mp(name: str, kind: str, why: str) -> Private:
    # torch elastic's multiprocessing, in NVRx 0.4's copy and in torch (0.6+)
    return Private(f"{COMPAT_MP}:MultiprocessContext", name, kind, why, ("0.4",), ("0.4.1",))


def _torch_mp(name: str, kind: str, why: str) -> Private:
    return Private(f"{TORCH_MP}:MultiprocessContext", name, kind, why, ("0.6+",), ("0.7.0",))


NAMES: tuple[Private, ...] = (
    # torch elastic's seams, which NVRx's agent fills and resctl's agent extends
    _agent("_start_workers", "method", "the health gate, a job stop handed to new workers, late preload"),
    _agent("_stop_workers", "method", "the restart-stop marker before a stop"),
    _agent("_monitor_workers", "method", "another node's stop decided before NVRx's restart"),
    _agent("_restart_workers", "method", "no restart once the workers left on a job stop"),
    _agent("_invoke_run", "method", "where a swallowed stop may be raised again"),
    _agent("_rendezvous", "method", "the workers' key space in the rendezvous store, per round"),
    _agent("_shutdown", "method", "0.6+: the leftover cleanup without NVRx's fixed 1 s sleep"),
    _agent("_setup_local_watchdog", "method", "the last look at the workers' environment (the agent's store)"),
    _agent("_assign_worker_ranks", "method", "0.6+: the only reader of TORCH_ELASTIC_WORKER_IDENTICAL, which "
           "NVRx sets for it and which resctl keeps from the workers"),
    # NVRx agent state the resctl agent reads or writes
    _agent("_pcontext", "instance", "the workers' process context: PIDs, result queues"),
    _agent("_workers_stop_timeout", "instance", "how long a restart stop may wait"),
    _agent("_term_timeout", "instance", "how long a job stop handed to new workers may take"),
    _agent("_worker_group", "instance", "the round's store, node count and ranks"),
    _agent("_children_pgids", "instance", "0.6+: the stopped workers' process groups"),
    _agent("_worker_watchdog", "instance", "0.6+: stopped in `_shutdown`, as NVRx's does"),
    _agent("_is_store_host", "instance", "the store host waits for the other nodes at the end"),
    Private(f"{LAUNCHER}:LocalElasticAgent", "_rdzv_handler", "instance", "0.6+: its barrier state",
            ("0.6+",), ("0.7.0",)),
    Private("nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier:FtRendezvousBarrierHandler",
            "_barrier_state", "instance", "0.6+: the barrier rendezvous' round state", ("0.6+",), ("0.7.0",)),
    Private("nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier:_RendezvousBarrierState",
            "_sync_from_per_round_state", "method", "0.6+: move to the open round before a restart's rendezvous",
            ("0.6+",), ("0.7.0",)),
    # resctl's rendezvous (`resctl.launch.rdzv_install`, the agent's `_rendezvous`/`_share_and_gather` on 0.4)
    Private(LAUNCHER, "_register_ft_rdzv_handler", "attribute", "where resctl's c10d handler replaces NVRx's"),
    Private("torch.distributed.elastic.rendezvous.api:RendezvousHandlerRegistry", "_registry", "instance",
            "0.6+: the c10d name taken back before resctl's handler registers", ("0.6+",), ("0.7.0",)),
    Private(f"{COMPAT_RDZV}:RendezvousHandlerRegistry", "_registry", "instance",
            "the c10d name taken back before resctl's handler registers", ("0.4",), ("0.4.1",)),
    Private(f"{LAUNCHER}:LocalElasticAgent", "_share_and_gather", "method",
            "0.4: nodes' local world sizes from resctl's round outcome", ("0.4",), ("0.4.1",)),
    Private(COMPAT_API, "_RoleInstanceInfo", "attribute", "0.4: what `_share_and_gather` returns", ("0.4",),
            ("0.4.1",)),
    # NVRx 0.4's own c10d rendezvous state, read by `resctl.launch.spares` after a peer's stop (launch.rendezvous
    # = "nvrx", the opt-out): who waits as a spare, and who joined since the last round
    *(Private(f"{FT_RDZV}:FtRendezvousHandler", name, "instance", why, ("0.4",), ("0.4.1",)) for name, why in (
        ("_state_holder", "the rendezvous state, synced from the store"), ("_settings", "min and max nodes"),
        ("_heartbeat_lock", "held while the state is synced (the keep-alive thread syncs it too)"),
        ("_op_executor", "holds the last round's participants"))),
    Private(f"{FT_RDZV}:_DistributedRendezvousOpExecutor", "_prev_participants", "instance",
            "the last round's participants: a spare already in the next round counts", ("0.4",), ("0.4.1",)),
    # the process context of forked workers
    _mp("_pc", "instance", "torch.multiprocessing's ProcessContext: a quick join, the workers' exit codes"),
    _mp("_poll", "method", "a worker that exited 0 without a result is done"),
    _mp("_ret_vals", "instance", "the result queues: their fds wake the monitor sleep"),
    _mp("_return_values", "instance", "the results read so far"),
    _mp("_worker_finished_event", "instance", "released once every worker is done"),
    _mp("_is_done", "method", "every worker posted or exited 0"),
    _torch_mp("_pc", "instance", "as in NVRx 0.4's copy"),
    _torch_mp("_poll", "method", "as in NVRx 0.4's copy"),
    _torch_mp("_ret_vals", "instance", "as in NVRx 0.4's copy"),
    _torch_mp("_return_values", "instance", "as in NVRx 0.4's copy"),
    _torch_mp("_worker_finished_event", "instance", "as in NVRx 0.4's copy"),
    _torch_mp("_is_done", "method", "as in NVRx 0.4's copy"),
    # the process context of exec'd workers
    Private(f"{COMPAT_MP}:SubprocessContext", "_poll", "method", "workers that left on a job stop wait for the "
            "others' final saves", ("0.4",), ("0.4.1",)),
    Private(f"{TORCH_MP}:SubprocessContext", "_poll", "method", "as in NVRx 0.4's copy", ("0.6+",), ("0.7.0",)),
    Private(COMPAT_MP, "_terminate_process_handler", "attribute", "the stop signals' handler the agent takes over",
            ("0.4",), ("0.4.1",)),
    Private(TORCH_MP, "_terminate_process_handler", "attribute", "the stop signals' handler the agent takes over",
            ("0.6+",), ("0.7.0",)),
    # torch's, in the workers (`resctl.shim.busy`: each rank's own work in a synchronous step)
    Private("torch.nn.parallel:DistributedDataParallel", "_check_comm_hook", "method",
            "a comm hook the script registers inside the shim's timed one is checked as DDP checks it"),
    Private("torch._C", "_current_graph_task_id", "attribute",
            "a collective's wait in autograd's thread is the training step's (FSDP2's own test for its backward)"),
)


def _resolve(owner: str) -> object:
    module, _, qualname = owner.partition(":")
    obj: object = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def _assigned(cls: type, name: str) -> bool:
    pattern = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=")
    for klass in inspect.getmro(cls):
        try:
            if pattern.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):  # a builtin, or no source shipped
            continue
    return False


def present(entry: Private) -> bool:
    """The installed NVRx/torch has this name where resctl looks for it."""
    try:
        owner = _resolve(entry.owner)
    except (ImportError, AttributeError):
        return False
    if entry.kind == "instance":
        return isinstance(owner, type) and _assigned(owner, entry.name)
    return hasattr(owner, entry.name)


def missing(series: str) -> list[Private]:
    """The names the launcher of `series` ("0.4", "0.6+") needs that the installed NVRx/torch lack."""
    return [entry for entry in NAMES if series in entry.series and not present(entry)]


def refusal(version: str) -> str | None:
    """Why resctl's launcher cannot drive the installed NVRx `version` (a console message), or None."""
    from resctl.errors import UsageError
    from resctl.profile.nvrx_versions import CHECKED, SUPPORTED, series_for

    try:
        series = series_for(version)
    except UsageError as err:
        return str(err)
    lacking = missing(series)
    if not lacking:
        return None
    return (f"NVRx {version} lacks {', '.join(e.label for e in lacking)}, which resctl's launcher needs "
            f"(resctl.launch.nvrx_private; checked on {', '.join(CHECKED)}): resctl drives NVRx {SUPPORTED}. "
            "Install one of those (pip install 'nvidia-resiliency-ext>=0.6,<0.8', or 0.4.1 on glibc < 2.39).")
