"""Where resctl's rendezvous (`resctl.launch.owned_rdzv`) enters ft_launcher, on every NVRx version:
one entry, `install(patches)`, called once in the launcher process before ft_launcher's `main`.

The seam is the one ft_launcher itself uses to put its rendezvous in: `launcher._register_ft_rdzv_handler`
(NVRx 0.4.1 and 0.7.0 alike) registers NVRx's handler as the `c10d` backend of the rendezvous handler
registry (0.4/0.5: NVRx's copy of torch elastic's registry; 0.6+: torch's own). `install` wraps that
function: NVRx's registration runs first (0.7: with its TCPStore settings), then resctl's handler takes
the `c10d` name, on the store `create_backend` makes, so the store host and the run's key space stay
as they were. A backend name of resctl's own (torch's public registry, `--rdzv-backend resctl`) would
need no wrap, but ft_launcher 0.4.1 and 0.7.0 both refuse any backend but `c10d` before they start,
and re-register `c10d` in their `main`: after that call is the first moment resctl's can take the name.

What each agent asks of its handler differs:

- NVRx 0.4/0.5 run torch elastic's agent (their copy): it asks what torch's `RendezvousHandler` has
  (`next_rendezvous` as a tuple, `num_nodes_waiting` to see a restart). Two methods of that agent are
  replaced here (`_rendezvous`: the handler learns the node's local world size and role before the
  round; `_share_and_gather`: each node's local world size comes from the round's outcome, not from an
  all-gather of N keys). An agent class of resctl's that stands in for those patches calls
  `owned_rdzv.before_round(handler, worker_group)` in its `_rendezvous` and answers `_share_and_gather`
  with `owned_rdzv.gathered(handler, ...)`.
- NVRx 0.6+ run their own agent over torch's: it calls `set_worker_group` before each round, takes
  `next_rendezvous`' `RendezvousInfo`, learns of a peer's restart by `is_next_round_open()` and opens
  the next round itself through `_barrier_state.open_rendezvous()`, asks `round()` for the restarts
  already made, and records shutdown reasons. `BarrierAgentHandler` answers those names with resctl's
  own operations; nothing of NVRx's agent is patched.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from resctl.launch import owned_rdzv, rdzv_rounds, store_guard, store_keeper
from resctl.launch.spares import SpareConsole
from resctl.patching import Patches
from resctl.profile.contract import RUN_DIR

log = logging.getLogger(__name__)

#: NVRx >= 0.6's shutdown reasons (fault_tolerance.utils); a copy for versions that lack them.
GRACEFUL, FAILURE = "graceful", "failure"


def install(patches: Patches, env: Any = None, agent_methods: bool = True) -> bool:
    """Make resctl's rendezvous ft_launcher's `c10d` handler when the plan asks for it
    (`rdzv_rounds.IMPL_ENV` = "resctl"); False when it does not or the launcher has no known seam.
    `agent_methods=False`: an agent class of resctl's does NVRx 0.4/0.5's two agent methods itself
    (`owned_rdzv.before_round` in its `_rendezvous`, `owned_rdzv.gathered` in its `_share_and_gather`)."""
    env = os.environ if env is None else env
    if env.get(rdzv_rounds.IMPL_ENV) != "resctl":
        return False
    from nvidia_resiliency_ext.fault_tolerance import launcher

    register = getattr(launcher, "_register_ft_rdzv_handler", None)
    if register is None:
        return False
    keep_alive = float(env.get(rdzv_rounds.KEEP_ALIVE_ENV) or 1.0)
    misses = int(env.get(rdzv_rounds.MISSES_ENV) or 3)
    external = env.get(rdzv_rounds.STORE_ENV) == "external"
    compat = compat_agent_api()
    registry = _registry()

    def register_owned() -> None:
        register()  # NVRx's: swaps torch's c10d handler for its own; ours replaces that one
        registry._registry.pop("c10d", None)
        registry.register("c10d", lambda params: owned_handler(params, keep_alive, misses, barrier=compat is None,
                                                               external=external))

    patches.set(launcher, "_register_ft_rdzv_handler", register_owned)
    if compat is not None and agent_methods:
        _compat_agent(patches, compat)
    return True


def compat_agent_api() -> Any:
    """NVRx 0.4/0.5's copy of torch elastic's agent API (None on 0.6+: torch's own, NVRx's agent over it)."""
    try:
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api
    except ImportError:
        return None
    return api if hasattr(api.SimpleElasticAgent, "_share_and_gather") else None


def _registry() -> Any:
    try:
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous import rendezvous_handler_registry
    except ImportError:
        from torch.distributed.elastic.rendezvous import rendezvous_handler_registry  # type: ignore[no-redef]
    return rendezvous_handler_registry


def _compat_agent(patches: Patches, api: Any) -> None:
    """NVRx 0.4/0.5's agent: the handler sees the spec before each round, ranks come from the outcome."""
    share_and_gather, rendezvous = api.SimpleElasticAgent._share_and_gather, api.SimpleElasticAgent._rendezvous

    def rendezvous_with_spec(self: Any, worker_group: Any) -> Any:
        owned_rdzv.before_round(worker_group.spec.rdzv_handler, worker_group)
        return rendezvous(self, worker_group)

    def gather_from_outcome(self: Any, store: Any, group_rank: int, group_world_size: int, spec: Any) -> Any:
        infos = owned_rdzv.gathered(spec.rdzv_handler, spec, group_world_size, api._RoleInstanceInfo)
        return infos if infos is not None else share_and_gather(self, store, group_rank, group_world_size, spec)

    patches.set(api.SimpleElasticAgent, "_rendezvous", rendezvous_with_spec)
    patches.set(api.SimpleElasticAgent, "_share_and_gather", gather_from_outcome)


def owned_handler(params: Any, keep_alive: float, misses: int, barrier: bool = False, external: bool = False) -> Any:
    """What NVRx's own handler factory does (its store, its IPC socket from the ranks, its GPU health
    check), with resctl's handler; `barrier`: the one NVRx >= 0.6's agent drives. The handler's requests
    go through a `StoreGuard`: the store lost stops the job with a reason (`external`: it was a `resctl
    store`); the rounds' PrefixStores (the agents' and workers') are over the store itself."""
    from nvidia_resiliency_ext.fault_tolerance import launcher
    from nvidia_resiliency_ext.fault_tolerance.ipc_connector import IpcConnector
    from nvidia_resiliency_ext.shared_utils.health_check import GPUHealthCheck


    try:
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.c10d_rendezvous_backend import (
            create_backend,
        )
    except ImportError:
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend  # type: ignore[no-redef]

    # The store host's store in a keeper process forked now, before this launcher's first thread (none of its
    # forks may inherit the store thread's resolver lock: resctl.launch.store_keeper); NVRx's way where it cannot.
    kept = store_keeper.serve_apart(params, use_libuv="_torch_elastic_compat" not in create_backend.__module__)
    _, store = create_backend(kept[0] if kept is not None else params)
    connector = IpcConnector(launcher.FT_LAUNCHER_IPC_SOCKET)
    connector.start_receiving()
    kind = BarrierAgentHandler if barrier else owned_rdzv.OwnedRendezvousHandler
    # Guarded where the store is another process's: a `resctl store`, or another node's (is_host=0). The node
    # that hosts it never loses it while it runs; a failed request there is its own shutdown's order (NVRx
    # 0.7's store host closes it while its agent still asks it once at a job's end: that exits 0, not 95).
    is_host = params.get_as_bool("is_host", None) if hasattr(params, "get_as_bool") else None
    guarded = (store_guard.StoreGuard(store, store_guard.StoreLost(store_guard.endpoint_of(store), external))
               if external or is_host is False else store)
    handler = kind(guarded, owned_rdzv.settings_from(params, keep_alive, misses), connector=connector,
                   health_check=lambda: GPUHealthCheck()(), base_store=store)
    handler.on_register = _write_slot
    handler.first_rank = 0 if is_host is True else -1  # external: is_host is 0 (plan.py)
    handler.on_spare = SpareConsole()
    if isinstance(handler, BarrierAgentHandler):
        handler.local_addr = getattr(params, "local_addr", None)
    return handler


def _write_slot(slot: int) -> None:
    """This node's member slot, in the run directory, for `resctl run` (it marks the slot dead when
    the launcher dies: the next restart round then waits for no keep-alive to expire)."""
    run_dir = os.environ.get(RUN_DIR)
    if run_dir:
        try:
            (Path(run_dir) / rdzv_rounds.SLOT_FILE.format(pid=os.getpid())).write_text(str(slot))
        except OSError:
            pass


def _reasons() -> tuple[str, str, frozenset[str]]:
    """(graceful, failure, the no-restart reasons) as NVRx >= 0.6 names them."""
    try:
        from nvidia_resiliency_ext.fault_tolerance import utils

        return (utils.RDZV_SHUTDOWN_REASON_GRACEFUL, utils.RDZV_SHUTDOWN_REASON_FAILURE,
                frozenset(utils.RDZV_NO_RESTART_REASONS))
    except (ImportError, AttributeError):
        return GRACEFUL, FAILURE, frozenset()


class _RoundOpener:
    """What NVRx >= 0.6's agent reaches through its handler's `_barrier_state`: opening the next round
    after a failure here, and (store host, at the end) a request for attribution, which resctl's
    rendezvous has no service for."""

    def __init__(self, handler: BarrierAgentHandler) -> None:
        self._handler = handler

    def open_rendezvous(self) -> None:
        self._handler.open_next_round()

    def _request_terminal_attribution_for_submitted_cycle(self) -> None:
        return None


class BarrierAgentHandler(owned_rdzv.OwnedRendezvousHandler):
    """resctl's rendezvous under the names NVRx >= 0.6's agent calls (its barrier handler's)."""

    #: This node's address (`--local-addr`): rank 0's names the workers' bootstrap store, as NVRx's
    #: handler does (the host name may resolve elsewhere, e.g. to another network namespace's address).
    local_addr: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._barrier_state = _RoundOpener(self)
        self._this_node = f"{socket.gethostname()}_{os.getpid()}"  # profiling events name the node so
        self._agent: Any = None

    @property
    def use_agent_store(self) -> bool:
        return False  # as NVRx's barrier handler: the bootstrap store info below names rank 0's

    def set_agent(self, agent: Any) -> None:
        self._agent = agent

    def set_worker_group(self, worker_group: Any) -> None:
        owned_rdzv.before_round(self, worker_group)

    def next_rendezvous(self) -> Any:  # type: ignore[override]
        from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo

        store, rank, size = super().next_rendezvous()
        try:
            bootstrap = RendezvousStoreInfo.build(rank, store, local_addr=self.local_addr or socket.getfqdn())
        except TypeError:  # torch <= 2.5.1
            bootstrap = RendezvousStoreInfo.build(rank, store)  # type: ignore[call-arg]
        return RendezvousInfo(store, rank, size, bootstrap)

    def is_next_round_open(self) -> bool:
        return self.next_round_open()

    def attribution_stop_requested(self) -> bool:
        return False  # no attribution service: no verdict to stop on

    def signal_no_restart(self, reason: str) -> None:
        """No node restarts (the progress tracker saw none): record why, then open the next round,
        which every healthy agent polls, as NVRx's does."""
        try:
            self._store.compare_set(self._keys.reason, "", reason)
        finally:
            self.open_next_round()

    def no_restart_reason(self) -> str | None:
        reason = self.close_reason()
        return reason if reason in _reasons()[2] else None

    def shutdown(self, reason: str = GRACEFUL) -> bool:  # type: ignore[override]
        if reason != GRACEFUL:
            return self.close_for(reason)
        return super().shutdown()

    def shutdown_due_to_failure(self) -> bool:
        return self.close_for(_reasons()[1])

    def is_shutdown_due_to_failure(self) -> bool:
        return self.close_reason() == _reasons()[1]
