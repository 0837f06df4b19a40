"""Hot spares, and a node that leaves the job on its own stop (one pod evicted, one node's step signalled).

Spares: a node that comes to a full job (launch.nnodes' maximum reached) waits, starts no worker, and
joins the next round that has room. resctl's rendezvous (the default, `resctl.launch.owned_rdzv`) tells
`SpareConsole` when this node starts to wait and when it joins; with `launch.rendezvous = "nvrx"` on NVRx
0.4/0.5 `spare_lines` reads the same from NVRx's join (its redundancy list). Either way one console
line when this node becomes a spare and one when it leaves the spares to join.

A node's own stop: its workers begin the job stop and the ranks of every node agree on one stop step
and save the final checkpoint there (resctl/shim/stopstep.py); a worker woken by another node's stop
says so in its launcher's private stop directory (`stop.mark_left`). The launchers of the other nodes
received no stop, so NVRx would restart their workers and wait in the next round for the node that
left, up to the join timeout, then fail. `decide_after_peer_stop` decides instead, before that restart:

- the job can go on without one node (a spare is waiting, or launch.nnodes' range allows one node
  fewer): restart; the next round takes the spare or closes smaller and resumes from the final checkpoint;
- it cannot (a fixed node count and no spare): this node stops too, as for its own stop (exit 143),
  so the scheduler's restart of the job resumes from that final checkpoint.
"""

from __future__ import annotations

import logging
import pickle
import socket
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from resctl.launch.owned_rdzv import read_state
from resctl.launch.preload import LatePreload
from resctl.launch.rdzv_rounds import RendezvousView, RoundState
from resctl.patching import Patches

#: A spare moves from the redundancy list to the wait list in two writes of the rendezvous state: one that
#: reads the state between them sees it on neither. A "cannot go on" is read again RECHECKS times.
RECHECKS = 2
RECHECK_SECONDS = 0.5


@dataclass(frozen=True)
class Room:
    """What the rendezvous holds when a node has left: the nodes of the cycle that ended, the range's
    minimum, and the nodes waiting to join (spares on the redundancy list, new arrivals on the wait list)."""

    nodes: int
    min_nodes: int
    max_nodes: int
    waiting: int

    def goes_on(self) -> bool:
        """One node fewer still fits the range, or a waiting node takes its place."""
        return self.waiting > 0 or self.nodes - 1 >= self.min_nodes

    def why(self) -> str:
        size = f'"{self.min_nodes}"' if self.min_nodes == self.max_nodes else f'"{self.min_nodes}:{self.max_nodes}"'
        if self.waiting:
            return f"a spare node takes its place ({self.waiting} waiting)"
        if self.nodes - 1 >= self.min_nodes:
            return f"launch.nnodes = {size} allows {self.nodes - 1} node(s)"
        return f"launch.nnodes = {size} and no spare node is waiting"

    @classmethod
    def of(cls, state: RoundState, nodes: int) -> Room:
        """From resctl's rendezvous: `nodes` in the cycle that ended, its live spares (or nodes already
        in the next round that were not in it) waiting."""
        return cls(nodes, state.min_nodes, state.max_nodes, len(state.spares))


#: Why there is no decision with a rendezvous resctl cannot read (NVRx >= 0.6's own, the opt-out).
UNREADABLE = ("NVRx {version}'s own rendezvous (launch.rendezvous = \"nvrx\") cannot be read by resctl, so NVRx restarts "
              "this node as it always did; resctl's rendezvous (launch.rendezvous = \"auto\", the default) decides "
              "whether the job goes on")


def handler_of(agent: Any) -> Any:
    """The agent's rendezvous handler (None before its first round)."""
    return getattr(getattr(getattr(agent, "_worker_group", None), "spec", None), "rdzv_handler", None)


def room(agent: Any) -> Room | None:
    """The rendezvous' state as this launcher's handler sees it now: resctl's (its typed state), or
    NVRx 0.4/0.5's c10d handler (its private state); None for another shape (NVRx >= 0.6's barrier)."""
    handler = handler_of(agent)
    nodes = getattr(getattr(agent, "_worker_group", None), "group_world_size", None)
    if handler is None or not isinstance(nodes, int):
        return None
    if isinstance(handler, RendezvousView):
        state = handler.state()
        logging.getLogger(__name__).info("a peer's stop: round %s members=%s spares=%s next_open=%s", state.round,
                                         list(state.members), list(state.spares), state.next_open)
        return Room.of(state, nodes)
    return _nvrx_room(handler, nodes)


def _nvrx_room(handler: Any, nodes: int) -> Room | None:
    """NVRx 0.4/0.5's c10d rendezvous state (launch.rendezvous = "nvrx"): its state holder, synced now."""
    holder, settings = getattr(handler, "_state_holder", None), getattr(handler, "_settings", None)
    if holder is None or settings is None:
        return None
    with handler._heartbeat_lock:  # the keep-alive thread uses the same holder
        if hasattr(holder, "_last_sync_time"):
            holder._last_sync_time = float("-inf")  # read the store now, not the state cached for a second
        holder.sync()
        state = holder.state
    logging.getLogger(__name__).info(
        "a peer's stop: round %s complete=%s participants=%s wait_list=%s redundancy_list=%s", state.round,
        state.complete, sorted(map(str, state.participants)), sorted(map(str, state.wait_list)),
        sorted(map(str, state.redundancy_list)))
    # A spare that saw the room first may be on the wait list already, or a participant of the round to come.
    executor = getattr(handler, "_op_executor", None)  # the last round's participants are its, not the handler's
    newcomers = set(state.participants) - set(getattr(executor, "_prev_participants", None) or state.participants)
    return Room(nodes, int(settings.min_nodes), int(settings.max_nodes),
                len(set(state.redundancy_list) | set(state.wait_list) | newcomers))


def decide_after_peer_stop(agent: Any, console: Any = None) -> bool:
    """Another node stopped the job and this node's workers left with it (final checkpoint saved): True
    when this launcher should stop too (exit 143), False to restart; one console line either way (none for a
    rendezvous of another shape, where NVRx restarts as it always did)."""
    console = console or sys.stderr
    found, reason = None, ""
    for attempt in range(RECHECKS + 1):
        if attempt:
            time.sleep(RECHECK_SECONDS)
        try:
            found = room(agent)
        except Exception as err:  # noqa: BLE001 - the store gone with the leaving host: the job cannot go on
            found, reason = None, f"the rendezvous cannot be read ({type(err).__name__}: {err})"
            break
        if found is None:  # NVRx >= 0.6's own barrier rendezvous (the opt-out): NVRx's restart, as before
            console.write(f"resctl: another node was stopped (SIGTERM) and every rank saved the final checkpoint "
                          f"with it; {UNREADABLE.format(version=_nvrx_version())}\n")
            console.flush()
            return False
        reason = found.why()
        if found.goes_on():
            break
    if found is not None and found.goes_on():
        console.write(f"resctl: another node was stopped (SIGTERM) and every rank saved the final checkpoint "
                      f"with it; the job goes on without that node: {reason}\n")
        console.flush()
        return False
    console.write(f"resctl: another node was stopped (SIGTERM) and every rank saved the final checkpoint with "
                  f"it; the job cannot go on without that node ({reason}): this "
                  "node stops too (exit 143), and a restart of the job resumes from that checkpoint\n")
    console.flush()
    return True


def _nvrx_version() -> str:
    try:
        import importlib.metadata as md

        return md.version("nvidia-resiliency-ext")
    except Exception:  # noqa: BLE001 - only named in a console line
        return "?"


def spare_line(nodes: int, max_nodes: int) -> str:
    return (f"resctl: this node is a spare: the job has its {nodes} node(s) (launch.nnodes maximum {max_nodes}); it "
            "waits and takes the place of a node that is lost or leaves\n")


JOINING_LINE = "resctl: a place in the job is free: this spare node joins it\n"


class SpareConsole:
    """resctl's rendezvous tells it when this node waits as a spare and when it joins: one line each
    (the first wait only, until it joins), and the late imports start while it waits."""

    def __init__(self, console: Any = None) -> None:
        self._console = console
        self.said = False

    def _write(self, line: str) -> None:
        out = self._console or sys.stderr
        try:
            out.write(line)
            out.flush()
        except Exception:  # noqa: BLE001 - a console line is never worth a launcher crash
            pass

    def waiting(self, nodes: int, max_nodes: int) -> None:
        if not self.said:
            self.said = True
            self._write(spare_line(nodes, max_nodes))
            try:
                LatePreload.start_now()  # what its first workers would import, while it waits
            except Exception as err:  # noqa: BLE001 - imports the workers make anyway; never a launcher crash
                logging.getLogger(__name__).debug("spare: late preload not started: %s", err)

    def joining(self) -> None:
        if self.said:
            self.said = False
            self._write(JOINING_LINE)


class _Spare:
    said = False


def spare_lines(patches: Patches, console: Any = None) -> None:
    """With NVRx 0.4/0.5's own rendezvous (launch.rendezvous = "nvrx"): a console line when this node
    becomes a spare, and one when it leaves NVRx's redundancy list to join."""
    try:
        from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as rdzv
    except ImportError:
        return
    join_op = getattr(rdzv, "_RendezvousJoinOp", None)
    if join_op is None or not hasattr(rdzv, "_Action"):
        return  # another rendezvous (NVRx >= 0.6's barrier): nothing known to hook
    original = join_op.__call__

    def saying_join(self: Any, ctx: Any, deadline: float) -> Any:
        action = original(self, ctx, deadline)
        out = console or sys.stderr
        try:
            spare = ctx.node in ctx.state.redundancy_list
            if spare and action == rdzv._Action.REMOVE_FROM_REDUNDANCY_LIST:
                _Spare.said = False
                out.write(JOINING_LINE)
                out.flush()
            elif spare and not _Spare.said:
                _Spare.said = True
                out.write(spare_line(len(ctx.state.participants), ctx.settings.max_nodes))
                out.flush()
                LatePreload.start_now()  # what its first workers would import, while it waits
        except Exception:  # noqa: BLE001 - a console line is never worth a launcher crash
            pass
        return action

    patches.set(join_op, "__call__", saying_join)
    patches.on_undo(lambda: setattr(_Spare, "said", False))


def wait_for_full_round(endpoint: str, run_id: str, nodes: int, timeout: float, poll: float = 0.5,
                        rendezvous: str = "resctl") -> bool:
    """Until the launchers' rendezvous at `endpoint` ("host:port") has a complete round of at least `nodes`
    participants (True), or `timeout` seconds (False). A node the cluster preflight left untested (it came to a
    full job) waits here before its launcher starts, so the rendezvous keeps it as the spare instead of letting
    it in before a tested node. `rendezvous`: "resctl" (resctl's, read through its typed state) or "nvrx"
    (NVRx 0.4/0.5's c10d state; NVRx >= 0.6's own cannot be read: `UnreadableRendezvous`)."""
    import torch.distributed as dist

    from resctl.profile.schema import split_endpoint

    full = _full_round_reader(run_id, nodes, rendezvous)
    host, port = split_endpoint(endpoint, 0)
    deadline = time.monotonic() + timeout
    store = None
    while time.monotonic() < deadline:
        try:
            if store is None:
                socket.create_connection((host, port), timeout=1.0).close()  # c10d logs each failed connect loudly
                store = dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=max(1.0, 4 * poll)))
            if full(store):
                return True
        except Exception:  # noqa: BLE001 - the host's launcher not up yet, or the state not written: poll again
            store = None
        time.sleep(poll)
    return False


class UnreadableRendezvous(Exception):
    """The preflight's wait cannot read this rendezvous (NVRx >= 0.6's own, launch.rendezvous = "nvrx")."""


def _full_round_reader(run_id: str, nodes: int, rendezvous: str) -> Any:
    """A function of the store: True once a round of at least `nodes` nodes has closed."""
    if rendezvous == "resctl":
        return lambda store: read_state(store, run_id).full_with(nodes)
    try:
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )
    except ImportError as err:
        raise UnreadableRendezvous(
            f"NVRx {_nvrx_version()}'s own rendezvous (launch.rendezvous = \"nvrx\") cannot be read by resctl, so "
            "this node cannot wait there for the tested nodes' round; resctl's rendezvous (launch.rendezvous = "
            "\"auto\", the default) can") from err

    def nvrx_full(store: Any) -> bool:
        got = C10dRendezvousBackend(store, run_id).get_state()
        state = pickle.loads(got[0]) if got else None  # the job's own rendezvous store (NVRx reads it so)
        return state is not None and state.complete and len(state.participants) >= nodes

    return nvrx_full
