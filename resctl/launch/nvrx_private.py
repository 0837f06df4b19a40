"""Every private name of NVRx and torch that resctl touches (the launcher, the shim, the checkpointer), with
the releases each was checked on. A release that renames one breaks a job silently; this list makes it loud:
`tests/unit/test_nvrx_private.py` fails when the installed NVRx (CI runs both 0.4.1 and 0.7.0) or torch
lacks one, `tests/unit/test_private_names.py` fails on a private torch/NVRx name in resctl's source that is
not listed here, and `resctl.launch.ft_entry` refuses to start a launcher whose NVRx or torch lacks one
(exit 2, before any worker).

Which code uses each: `resctl.launch.agent` (the agent's seams and state), `resctl.launch.adapters`
(what cannot be a method of the agent), `resctl.launch.spares`, `resctl.launch.rdzv_install`,
`resctl.launch.standby`, and the
workers' side (`resctl.shim`, `resctl.checkpoint`: the torch names at the end). Public names
(`LocalElasticAgent`, `RankMonitorServer.run`, `get_args_parser`, `ProcessContext.join`) are not
listed; a change there fails at import or in the tests.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import inspect
import platform
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from resctl.errors import UsageError
from resctl.profile.nvrx_versions import CHECKED, SUPPORTED, series_for

LAUNCHER = "nvidia_resiliency_ext.fault_tolerance.launcher"
#: NVRx 0.4/0.5 carry their own copy of torch elastic; 0.6+ use torch's.
COMPAT_MP = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing.api"
TORCH_MP = "torch.distributed.elastic.multiprocessing.api"
COMPAT_RDZV = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.api"
COMPAT_API = "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server.api"
FT_RDZV = "nvidia_resiliency_ext.fault_tolerance._ft_rendezvous"
BOTH = ("0.4.1", "0.7.0")
#: The torch release the torch names were checked on (under both NVRx releases).
TORCH_CHECKED = ("2.13.0",)


@dataclass(frozen=True)
class Private:
    """One private name: `owner` ("module:Class" or "module"), the name, how it is used, and where.

    Attributes:
        kind: "method" or "attribute" (looked up on the owner), "instance" (assigned as `self.NAME`
            in the owner's code, or declared `NAME: Type` in its body: an instance attribute resctl reads
            or writes), "module" (a private
            module `owner.NAME`).
        series: the ft_launcher series ("0.4", "0.6+") whose code has it; both when ("0.4", "0.6+").
        checked: NVRx releases it was verified on.
        torch_checked: for torch's names used by the workers, the torch releases it was verified on.
    """

    owner: str
    name: str
    kind: str
    why: str
    series: tuple[str, ...] = ("0.4", "0.6+")
    checked: tuple[str, ...] = BOTH
    torch_checked: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.owner.rsplit('.', 1)[-1]}.{self.name}"

    @property
    def path(self) -> str:
        """The dotted path as source spells it (`torch.distributed.distributed_c10d._get_default_store`)."""
        return f"{self.owner.replace(':', '.')}.{self.name}"

    @property
    def library(self) -> str:
        """Whose release decides: NVRx's, torch's, or Python's (a standard-library object torch hands resctl)."""
        top = self.owner.split(".", 1)[0]
        return {"nvidia_resiliency_ext": "NVRx", "torch": "torch"}.get(top, "Python")


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
    # exec'd workers started in a standby interpreter (`resctl.launch.standby`): the handler's Popen, in resctl's subclass
    Private("nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing.subprocess_handler."
            "subprocess_handler:SubprocessHandler", "_popen", "method", "a worker's process: its standby's, where one is "
            "ready", ("0.4",), ("0.4.1",)),
    Private("torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler:SubprocessHandler",
            "_popen", "method", "as in NVRx 0.4's copy", ("0.6+",), ("0.7.0",)),
    # NVRx 0.6+'s wait for GPU memory after a restart's stop, made relative (`resctl.launch.gpu_reclaim`)
    Private(f"{LAUNCHER}:LocalElasticAgent", "_wait_for_gpu_memory_reclaim", "method",
            "the wait for the stopped workers' GPU memory, from each GPU's use before the first workers", ("0.6+",),
            ("0.7.0",)),
    Private(f"{LAUNCHER}:LocalElasticAgent", "_ft_cfg", "instance", "gpu_memory_tolerance_mb and "
            "gpu_memory_reclaim_timeout of that wait", ("0.6+",), ("0.7.0",)),
    Private("multiprocessing.queues:SimpleQueue", "_reader", "instance",
            "the result queues' read end (torch's `_ret_vals`): its fd wakes the monitor sleep"),
    # resctl's rendezvous on NVRx 0.4 (`resctl.launch.rdzv_install`): the compat agent's seams
    Private("nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.c10d_rendezvous_backend",
            "C10dRendezvousBackend", "attribute", "0.4: the backend of resctl's rendezvous and of the spares' view",
            ("0.4",), ("0.4.1",)),
    Private(f"{COMPAT_API}:SimpleElasticAgent", "_rendezvous", "method", "0.4: the round's spec to resctl's handler",
            ("0.4",), ("0.4.1",)),
    Private(f"{COMPAT_API}:SimpleElasticAgent", "_share_and_gather", "method",
            "0.4: nodes' local world sizes from resctl's round outcome", ("0.4",), ("0.4.1",)),
    # NVRx 0.4's own rendezvous (`resctl.launch.spares`: the spare's console lines, launch.rendezvous = "nvrx")
    Private(FT_RDZV, "_RendezvousJoinOp", "attribute", "its __call__: a line when a node becomes or stops being a "
            "spare", ("0.4",), ("0.4.1",)),
    Private(FT_RDZV, "_Action", "attribute", "REMOVE_FROM_REDUNDANCY_LIST: the spare joins", ("0.4",), ("0.4.1",)),
    Private(f"{FT_RDZV}:_BackendRendezvousStateHolder", "_last_sync_time", "instance",
            "set to -inf so that the next sync reads the store", ("0.4",), ("0.4.1",)),
    # torch, in the workers (the shim, the checkpointer): checked on TORCH_CHECKED under both NVRx releases
    *(Private(owner, name, kind, why, torch_checked=TORCH_CHECKED) for owner, name, kind, why in (
        ("torch.distributed.distributed_c10d", "_get_default_store", "attribute",
         "the default group's store: checkpoint agreement (checkpoint/agree.py), the stop step (shim/stopstep.py)"),
        ("torch.distributed.rendezvous", "_create_c10d_store", "attribute",
         "wrapped: a worker's env:// store joins this round's key space (shim/agent_store.py)"),
        ("torch", "_foreach_copy_", "attribute", "one batched copy into the staging arena (checkpoint/staging.py)"),
        ("torch.distributed.checkpoint.state_dict", "_init_optim_state", "attribute",
         "wrapped: its zero-lr optimizer step is not counted as a training step (shim/dcpsaves.py)"),
        ("torch.utils.data:DataLoader", "_index_sampler", "attribute",
         "patched (checkpoint/dataposition.py): a resumed pass skips what was consumed"),
        ("torch.utils.data:DataLoader", "_iterator", "instance", "the persistent workers' iterator, resumed in place"),
        ("torch.utils.data.dataloader:_BaseDataLoaderIter", "_num_yielded", "instance",
         "how many batches the pass yielded (the data position)"),
        ("torch.utils.data.dataloader:_BaseDataLoaderIter", "_index_sampler", "instance",
         "a persistent iterator's sampler, replaced on resume (checkpoint/datapass.py)"),
        ("torch.nn.parallel:DistributedDataParallel", "_check_comm_hook", "method",
         "the script's own comm hook checked as DDP checks it (shim/busy.py)"),
        ("torch.distributed.tensor._api:DTensor", "_spec", "instance",
         "a staged shard's DTensor over host memory takes its source's spec, as FSDP2 builds its own (checkpoint/sharded.py)"),
        ("torch.distributed.tensor", "_random", "module", "DTensor's RNG state (shim/fresh.py)"),
        ("torch.distributed.tensor._random", "_rng_tracker", "attribute",
         "reset before an in-process restart (shim/fresh.py)"),
        ("torch._C", "_current_graph_task_id", "attribute",
         "a collective's wait in autograd's thread is the training step's (shim/busy.py; FSDP2's own test)"),
        ("torch", "_dynamo", "module", "preloaded beside forked workers (launch/preload.py), reset before an "
         "in-process restart (shim/fresh.py)"),
    )),
)


def _resolve(owner: str) -> object:
    module, _, qualname = owner.partition(":")
    obj: object = importlib.import_module(module)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


@functools.cache
def _source(klass: type) -> str:
    try:
        return inspect.getsource(klass)
    except (OSError, TypeError):  # a builtin, or no source shipped
        return ""


def _assignment(name: str) -> re.Pattern[str]:
    other = r"self\.\w+\s*,\s*"  # `self.a, self.NAME = ...` assigns it too
    return re.compile(rf"^\s*(?:{other})*self\.{re.escape(name)}\s*(?::[^=\n]+)?(?:,\s*self\.\w+\s*)*=(?!=)",
                      re.MULTILINE)


def _assigned(cls: type, name: str) -> bool:
    pattern = _assignment(name)
    return any(name in vars(klass).get("__annotations__", {}) or pattern.search(_source(klass))
               for klass in inspect.getmro(cls))  # declared (`NAME: Type` in the body) or assigned


def _unloaded_source(module: str) -> Path | None:
    """The source file of `module` when it is not imported yet (found without importing it or its packages:
    `torch._dynamo` or `torch.distributed.tensor` would cost the launcher a second each), else None."""
    if module in sys.modules:
        return None
    parts = module.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        package = sys.modules.get(".".join(parts[:cut]))
        bases = getattr(package, "__path__", None) or ()
        if cut == 1 and not bases:  # not even the top package imported: where the path finder would find it
            spec = importlib.machinery.PathFinder.find_spec(parts[0])
            bases = (spec.submodule_search_locations or ()) if spec is not None else ()
        for base in bases:
            where = Path(base, *parts[cut:])
            for candidate in (where.with_suffix(".py"), where / "__init__.py"):
                if candidate.is_file():
                    return candidate
    return None


def _in_unloaded(entry: Private) -> bool | None:
    """Whether a module-level name (or a module) is in the installed source of a module not imported yet; None
    when the module is imported (look it up) or not found by its path (import it)."""
    module, _, qualname = entry.owner.partition(":")
    if qualname:  # a class's instance attribute, in its module's source: assigned, or declared in the class body
        source = _unloaded_source(module) if entry.kind == "instance" else None
        if source is None:
            return None
        text = source.read_text(encoding="utf-8", errors="replace")
        declared = re.search(rf"^\s+{re.escape(entry.name)}\s*:[^=\n]+$", text, re.MULTILINE)
        return declared is not None or _assignment(entry.name).search(text) is not None
    if entry.kind == "module":
        full = f"{module}.{entry.name}"
        return True if full in sys.modules or _unloaded_source(full) is not None else None
    source = _unloaded_source(module)
    if source is None:
        return None
    text = source.read_text(encoding="utf-8", errors="replace")
    name = re.escape(entry.name)
    return re.search(rf"^(?:(?:async\s+)?def\s+|class\s+)?{name}\b\s*[:=(]", text, re.MULTILINE) is not None


def present(entry: Private) -> bool:
    """The installed NVRx/torch has this name where resctl looks for it (a module not imported yet is read,
    not imported)."""
    unloaded = _in_unloaded(entry)
    if unloaded is not None:
        return unloaded
    try:
        owner = _resolve(entry.owner)
    except (ImportError, AttributeError):
        return False
    if entry.kind == "instance":
        return isinstance(owner, type) and _assigned(owner, entry.name)
    if entry.kind == "module":
        try:
            importlib.import_module(f"{entry.owner}.{entry.name}")
        except ImportError:
            return False
        return True
    return hasattr(owner, entry.name)


def missing(series: str) -> list[Private]:
    """The names the launcher of `series` ("0.4", "0.6+") needs that the installed NVRx/torch lack."""
    return [entry for entry in NAMES if series in entry.series and not present(entry)]


def refusal(version: str) -> str | None:
    """Why resctl's launcher cannot drive the installed NVRx `version` (a console message), or None."""
    try:
        series = series_for(version)
    except UsageError as err:
        return str(err)
    lacking = missing(series)
    if not lacking:
        return None
    import torch

    versions = {"NVRx": version, "torch": torch.__version__, "Python": platform.python_version()}
    said = [f"{lib} {versions[lib]} lacks {', '.join(e.label for e in lacking if e.library == lib)}"
            for lib in versions if any(e.library == lib for e in lacking)]
    return (f"{'; '.join(said)}, which resctl needs (resctl.launch.nvrx_private; checked on NVRx "
            f"{', '.join(CHECKED)} with torch {', '.join(TORCH_CHECKED)}): resctl drives NVRx {SUPPORTED}. "
            "Install one of those (pip install 'nvidia-resiliency-ext>=0.6,<0.8', or 0.4.1 on glibc < 2.39), "
            "with a torch it was checked on.")
