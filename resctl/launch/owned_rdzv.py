"""resctl's own rendezvous handler for ft_launcher (`launch.rendezvous = "resctl"`, issue 25).

It stands where NVRx 0.4.1's `FtRendezvousHandler` stands (registered as the `c10d` handler, on the
store NVRx's `create_backend` made, so the store host and every key space below are unchanged) and
answers the same calls the launcher makes: `next_rendezvous`, `num_nodes_waiting`, `is_closed` /
`set_closed`, `shutdown`, `remove_this_node`, `num_nodes`, `round`, `_stop_heartbeats`.

Per node, a round costs O(1) store requests (rules and keys: `resctl.launch.rdzv_rounds`):

- join: read the latest round (one compare_set), check whether it closed, move the pointer, `add` to
  the round's counter (the arrival index), `set` one line about this node;
- wait: one blocking `wait` on the round's `done` key, then one `get` of the outcome (a rank per
  arrival: 2-5 bytes per node);
- the round's first arrival (the leader) polls the counter (one `add` every 50 ms) and closes the
  round with one `compare_set` as soon as the rules allow: max_nodes came, or min_nodes came and
  every node of the previous round that is still alive came, or the last call is over. The others'
  keep-alive threads apply the max/last-call rules too, so a lost leader delays, never blocks, it.
- keep-alive: one `set` of this node's heartbeat key every `launch.rdzv_keep_alive` (its own
  connection). A node counts as gone when its heartbeat is older than keep_alive x misses, or says
  it left; a restart round never waits for a gone node, and one the round does not need (max_nodes
  came without it: its replacement) is not waited for at all. NVRx waits 5 s x 3 for the lost node's
  entry to expire before any restart round can start.
- the watch, while a round trains: with each keep-alive, one `get` of one other member's heartbeat
  (the next in arrival order: every member has one watcher). Unchanged for 2 x keep_alive x misses of
  the watcher's own clock (`PeerWatch`), the member is lost: the watcher opens the next round and
  answers `num_nodes_waiting` with 1, so every agent restarts its workers for a round without it.
  A machine that goes away sends nothing (no FIN, no RST): without the watch the other nodes' workers
  waited in a collective for it until heartbeat.timeout (900 s by default) ended them.

Rounds are independent: a restart round does not need the last one's participants to leave it first.
Ranks: a node keeps its last group rank where it can (as NVRx's handler does), new nodes fill the gaps.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from resctl.errors import LaunchError
from resctl.launch.rdzv_rounds import (
    DEAD,
    LEFT,
    SLOT_FILE,
    Joiner,
    Keys,
    Outcome,
    PeerWatch,
    RoundState,
    close_size,
    is_alive,
    missing_alive,
    outcome_of,
    spares_of,
    watched,
)


def _no_worker_states() -> LaunchError:
    return LaunchError('launch.rendezvous = "resctl" keeps no worker states, which launch.restart_policy = '
                       '"min-healthy" needs: set launch.rendezvous = "nvrx" (or "auto", which picks NVRx\'s for it)')


log = logging.getLogger(__name__)

#: Values of a round's `done` key that are not an Outcome.
CLOSED, TIMED_OUT = "closed", "timeout"
#: How often the leader of a round looks at its counter.
LEADER_POLL_S = 0.05
#: A spare waits for the next round in blocking waits of this long (torch warns on each one that ends).
SPARE_WAIT_S = 3600.0


class _Errors:
    """The rendezvous exceptions the launcher's agent catches: NVRx 0.4/0.5's copy of torch elastic's,
    torch's own on NVRx >= 0.6 (which dropped the copy)."""

    @staticmethod
    def api() -> Any:
        try:
            from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous import api
        except ImportError:
            from torch.distributed.elastic.rendezvous import api  # type: ignore[no-redef]
        return api


class _Settings:
    """What NVRx's RendezvousSettings say that the launcher reads (`min_nodes`, `max_nodes`, `run_id`)."""

    def __init__(self, run_id: str, min_nodes: int, max_nodes: int, join_timeout: float, last_call: float,
                 keep_alive: float, misses: int, upscaling_enabled: bool) -> None:
        if not run_id:
            raise ValueError("The run id must be a non-empty string.")
        if min_nodes < 1 or max_nodes < min_nodes:
            raise ValueError(f"nnodes {min_nodes}:{max_nodes} is not a range of at least one node")
        self.run_id, self.min_nodes, self.max_nodes = run_id, min_nodes, max_nodes
        self.join_timeout, self.last_call = join_timeout, last_call
        self.keep_alive, self.misses, self.upscaling_enabled = keep_alive, misses, upscaling_enabled

    @property
    def expiry(self) -> float:
        return self.keep_alive * self.misses


class OwnedRendezvousHandler:
    """One agent's handle on the run's rendezvous (duck-typed NVRx `RendezvousHandler`)."""

    def __init__(self, store: Any, settings: _Settings, *, connector: Any = None, health_check: Any = None,
                 backend_name: str = "c10d", base_store: Any = None, connect: Any = None) -> None:
        self._store = store
        self._base_store = store if base_store is None else base_store  # what each round's PrefixStore is over
        self._settings = settings
        self._keys = Keys(settings.run_id)
        self._connect = connect  # makes the keep-alive's own connection (default: a new client of the same TCPStore)
        self._connector = connector  # NVRx's IPC socket from this node's ranks (exclude/shutdown requests)
        self._health_check = health_check
        self._backend_name = backend_name
        self._slot = -1  # this handler's member slot (its node id in the keys), once registered
        self._round, self._rank = -1, -1
        self._outcome: Outcome | None = None
        self._waiting_in: int | None = None  # the round this node is waiting in (the keep-alive thread helps close it)
        self._quorum_at: dict[int, float] = {}
        self._closable_since: dict[int, float] = {}  # the keep-alive thread's: when it first saw a round closable
        self._previous: dict[int, list[int]] = {}  # the leader's: each round's previous participants (slots)
        self._arrived: dict[int, set[int]] = {}  # ... and the slots that have arrived in it so far
        self._stop = threading.Event()
        self._beat_thread: threading.Thread | None = None
        self._beat_store: Any = None
        self._watch: PeerWatch | None = None  # while a round trains: the member this node watches
        self._peer_lost = False  # the watched member is lost: the agent restarts (num_nodes_waiting)
        self._seen_reason: tuple[str | None] | None = None  # the close reason as read when this node saw the close
        #: The rank this node asks for in its first round (-1: any). The store host asks for 0: where torchrun's static
        #: rendezvous and every launcher that hosted the store in a thread put it (the other nodes could join only
        #: after it had), and where users look for rank 0's console; a rank kept from a previous round comes first.
        self.first_rank = -1

    # --- what the launcher calls -------------------------------------------------------------

    @property
    def settings(self) -> _Settings:
        return self._settings

    def get_backend(self) -> str:
        return self._backend_name

    def get_run_id(self) -> str:
        return self._settings.run_id

    def next_rendezvous(self) -> tuple[Any, int, int]:
        import torch.distributed as dist

        self._watch, self._peer_lost = None, False
        self._register()
        deadline = time.monotonic() + self._settings.join_timeout
        while True:
            self._raise_if_closed(spare=False)
            rnd, waited = self._target_round()
            if waited:  # a spare's wait has no deadline; its join has the usual one (as NVRx's redundancy list)
                deadline = time.monotonic() + self._settings.join_timeout
            index = self._join(rnd)
            outcome = self._await(rnd, index, deadline)
            if index < outcome.size:
                break
            log.info("round %s of rendezvous %r closed without this node (arrival %s of %s); next round",
                     rnd, self._settings.run_id, index, outcome.size)
            self._round = rnd  # not a participant: the next round is a new arrival's
            self._rank = -1
        self._round, self._rank, self._outcome = rnd, outcome.ranks[index], outcome
        self._watch = self._watch_in(rnd, index, outcome.size)
        log.info("The node (slot %s) has joined round %s of the rendezvous %r as rank %s in a world of size %s.",
                 self._slot, rnd, self._settings.run_id, self._rank, outcome.size)
        return dist.PrefixStore(f"torch.rendezvous.{self._settings.run_id}.{rnd}", self._base_store), self._rank, outcome.size

    def num_nodes_waiting(self) -> int:
        """Nodes that joined the round after this node's (the launcher restarts its workers for them)."""
        if self._round < 0:
            return 0
        if self._peer_lost:  # a member of this round is lost (the watch): restart for a round without it
            return 1
        return int(self._store.add(self._keys.joined(self._round + 1), 0))

    def is_closed(self) -> bool:
        return bool(self._store.check([self._keys.closed]))

    def set_closed(self) -> None:
        """No round opens again; nodes waiting in a round or as spares are woken and leave."""
        self._store.set(self._keys.closed, "1")
        current = self._current()
        self._decide(self._store, current, CLOSED)
        self._store.set(self._keys.opened(current + 1), CLOSED)

    def shutdown(self) -> bool:
        self._stop_heartbeats()
        try:
            self.set_closed()
            return True
        except Exception as err:  # noqa: BLE001 - NVRx's handler answers False when the store is gone
            log.warning("The rendezvous %r could not be closed: %s", self._settings.run_id, err)
            return False

    def remove_this_node(self) -> None:
        if self._slot >= 0:
            self._store.set(self._keys.heartbeat(self._slot), LEFT)

    def num_nodes(self) -> int:
        """Members that have not left and whose heartbeat is fresh (the store host waits for 0 before it exits)."""
        count = int(self._store.add(self._keys.members, 0))
        if not count:
            return 0
        beats = self._store.multi_get([self._keys.heartbeat(s) for s in range(count)])
        now = time.time()
        return sum(is_alive(b, now, self._settings.expiry) for b in beats)

    def round(self) -> int:
        return self._current()

    # --- what resctl's features read (rdzv_rounds.RendezvousView) --------------------------------

    def state(self) -> RoundState:
        """The rendezvous now: the latest round with a world, its members, the live spares (O(N) reads:
        asked on a peer's stop or by the preflight's wait, never per round)."""
        s = self._settings
        return read_state(self._store, s.run_id, s.min_nodes, s.max_nodes, s.expiry)

    def open_next_round(self) -> None:
        """Open the round after this node's (a failure here: wakes the spares; NVRx >= 0.6's healthy
        agents see it through `next_round_open`, as 0.4's see a waiting node)."""
        self._store.compare_set(self._keys.opened(self._round + 1), "", "1")

    def next_round_open(self) -> bool:
        """A node has opened the round after this node's to restart (not the close of the job)."""
        key = self._keys.opened(self._round + 1)
        if not self._store.check([key]):
            return False
        raw = self._store.get(key)
        return (raw.decode() if isinstance(raw, bytes) else raw) != CLOSED

    def close_for(self, reason: str) -> bool:
        """Close the job's rendezvous and record why (the first reason recorded stays)."""
        try:
            self._store.compare_set(self._keys.reason, "", reason)
        except Exception as err:  # noqa: BLE001 - the close below says the same failure
            log.debug("could not record the rendezvous close reason: %s", err)
        return self.shutdown()

    def close_reason(self) -> str | None:
        """Why the job's rendezvous was closed (None: not closed with a reason). Once this node has seen the
        close, the reason read then (a closer records it before it closes): a spare asked after it marked
        itself gone may find the store host gone too (NVRx 0.7's agent asks twice; CI: exit 95, not 0)."""
        if self._seen_reason is not None:
            return self._seen_reason[0]
        return self._read_reason()

    def _read_reason(self) -> str | None:
        if not self._store.check([self._keys.reason]):
            return None
        raw = self._store.get(self._keys.reason)
        return (raw.decode() if isinstance(raw, bytes) else raw) or None

    # The min-healthy restart policy reads and writes worker states in the rendezvous; this one keeps
    # none, so the profile refuses that pairing (schema: launch.rendezvous vs launch.restart_policy).
    # Reaching these means a launcher called them anyway: say so plainly rather than pretend.
    def try_set_worker_state(self, target_state: Any) -> Any:
        raise _no_worker_states()

    def get_worker_states(self) -> Any:
        raise _no_worker_states()

    def _stop_heartbeats(self) -> None:
        self._stop.set()
        thread = self._beat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._settings.keep_alive + 1)

    # --- joining -----------------------------------------------------------------------------

    def _register(self) -> None:
        if self._slot >= 0:
            self._start_heartbeats()
            return
        try:  # the keep-alive's own connection, made before anything else uses the store from a thread
            self._beat_store = self._connect() if self._connect is not None else _second_client(self._base_store)
        except Exception as err:  # noqa: BLE001 - the shared connection still works (beats wait behind a wait)
            log.debug("rendezvous keep-alive: no second connection (%s); sharing the agent's", err)
            self._beat_store = self._base_store
        self._slot = int(self._store.add(self._keys.members, 1)) - 1
        self._beat()
        if self.on_register is not None:
            self.on_register(self._slot)
        self._start_heartbeats()

    def _current(self) -> int:
        return int(self._store.compare_set(self._keys.current, "", "0"))

    def _raise_if_closed(self, spare: bool) -> None:
        if self.is_closed():
            self._seen_reason = (self._read_reason(),)  # while the store host still waits for this node
            api = _Errors.api()
            if spare:  # gone for good: the store host waits for no spare that has left
                self._stop_heartbeats()
                try:
                    self.remove_this_node()
                except Exception as err:  # noqa: BLE001 - the store host gone meanwhile: it waits for no one
                    log.debug("rendezvous %r: could not mark this spare gone: %s", self._settings.run_id, err)
                raise api.RendezvousGracefulExitError(f"The rendezvous '{self._settings.run_id}' is closed, "
                                                      "terminating pending rendezvous.")
            raise api.RendezvousClosedError()

    def _target_round(self) -> tuple[int, bool]:
        """The round to join, and whether this node waited as a spare for it: the latest while it is
        open; the next one after a round this node was in, after one that closed without a world (timed
        out), or (a new node) when the last round has room; else the next one, once it opens."""
        latest = self._current()
        if not self._store.check([self._keys.done(latest)]):
            return latest, False
        if self._round == latest and self._rank >= 0:
            return latest + 1, False
        last = self._read_outcome_of(latest, self._store)
        if last is None or (last.size < self._settings.max_nodes and self._settings.upscaling_enabled):
            return latest + 1, False
        log.info("rendezvous %r: round %s is full; waiting as a spare for the next round", self._settings.run_id, latest)
        if self.on_spare is not None:
            self.on_spare.waiting(last.size, self._settings.max_nodes)
        self._wait_keys([self._keys.opened(latest + 1)], None)
        self._raise_if_closed(spare=True)
        if self.on_spare is not None:
            self.on_spare.joining()
        return latest + 1, True

    def _join(self, rnd: int) -> int:
        self._check_node()
        if rnd > 0:
            self._store.compare_set(self._keys.current, str(rnd - 1), str(rnd))
        index = int(self._store.add(self._keys.joined(rnd), 1)) - 1
        rank = self._rank if self._round >= 0 else self.first_rank  # new to the job: the rank it asks for
        me = Joiner(self._slot, self._round, rank, self._local_world_size(), self._role())
        self._store.set(self._keys.joiner(rnd, index), me.encode())
        if index == 0:
            self._store.set(self._keys.opened(rnd), "1")
        if index + 1 == self._settings.min_nodes:
            self._store.set(self._keys.quorum_at(rnd), repr(time.time()))
        return index

    def _check_node(self) -> None:
        """What NVRx's join does first: the GPU health check, then the ranks' control requests
        (ExcludeThisNode leaves, ShutdownWorkload closes the rendezvous)."""
        from nvidia_resiliency_ext.fault_tolerance.data import WorkloadAction
        from nvidia_resiliency_ext.fault_tolerance.launcher import UnhealthyNodeException

        if self._health_check is not None and not self._health_check():
            raise UnhealthyNodeException(f"Node (slot {self._slot}) has an unhealthy GPU.")
        requests = self._connector.fetch_received() if self._connector is not None else []
        actions = {req.action for _, req in requests}
        if WorkloadAction.ShutdownWorkload in actions:
            self.set_closed()
        if WorkloadAction.ExcludeThisNode in actions:
            raise UnhealthyNodeException(f"Node (slot {self._slot}) is excluded from the training due to an user request.")

    #: Called with the member slot once it is known (the adapter writes it for `resctl run`).
    on_register: Any = None
    #: Told when this node starts to wait as a spare (`waiting(nodes, max_nodes)`) and when it leaves
    #: the spares to join a round (`joining()`): `resctl.launch.spares.SpareConsole` prints them.
    on_spare: Any = None

    # The local world size and role come from the agent (set by the adapter before the first round).
    local_world_size = 1
    role = "default"

    def _local_world_size(self) -> int:
        return int(self.local_world_size)

    def _role(self) -> str:
        return str(self.role).replace(",", "_").replace("|", "_")

    # --- waiting for the round to close ---------------------------------------------------------

    def _await(self, rnd: int, index: int, deadline: float) -> Outcome:
        done = self._keys.done(rnd)
        self._waiting_in = rnd
        try:
            self._try_close(rnd, leader=index == 0, deadline=deadline)
            if index == 0:
                while not self._store.check([done]):
                    time.sleep(LEADER_POLL_S)
                    self._try_close(rnd, leader=True, deadline=deadline)
            else:
                self._wait_keys([self._keys.wake(rnd)], deadline)
        finally:
            self._waiting_in = None
        outcome = self._read_outcome(rnd)
        if outcome is None:
            raise RuntimeError(f"round {rnd} of rendezvous {self._settings.run_id!r} has no outcome")
        return outcome

    def _read_outcome(self, rnd: int) -> Outcome | None:
        raw = self._store.get(self._keys.done(rnd))
        text = raw.decode() if isinstance(raw, bytes) else raw
        api = _Errors.api()
        if text == CLOSED:
            raise api.RendezvousClosedError()
        if text == TIMED_OUT:
            raise api.RendezvousTimeoutError()
        return Outcome.decode(text)

    def _wait_keys(self, keys: list[str], deadline: float | None) -> None:
        """A blocking wait (no polling), bounded by the join deadline (None: none, in waits of an hour)."""
        while True:
            left = SPARE_WAIT_S if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise _Errors.api().RendezvousTimeoutError()
            try:
                self._store.wait(keys, timedelta(seconds=left))
                return
            except Exception as err:
                if "timeout" not in str(err).lower() and "timed out" not in str(err).lower():
                    raise

    def _try_close(self, rnd: int, *, leader: bool, deadline: float, store: Any = None) -> None:
        """Close round `rnd` if the rules allow it now (one compare_set: the first closer wins)."""
        store = store or self._store
        s = self._settings
        joined = int(store.add(self._keys.joined(rnd), 0))
        if store is not self._store and store.check([self._keys.done(rnd)]):  # decided: a closer may have died
            store.set(self._keys.wake(rnd), "1")  # before waking the others
            return
        if time.monotonic() > deadline and joined < s.min_nodes:
            self._decide(store, rnd, TIMED_OUT)
            return
        past_last_call = s.min_nodes <= joined < s.max_nodes and time.time() >= self._quorum_time(rnd, store) + s.last_call
        all_expected = leader and joined >= s.min_nodes and joined < s.max_nodes and self._all_expected(rnd, joined, store)
        size = close_size(joined, s.min_nodes, s.max_nodes, past_last_call=past_last_call, all_expected=all_expected)
        if size is None:
            return
        if store is not self._store and not self._backup_due(rnd):
            return  # a keep-alive thread closes only a round its leader or last arrival left open for a while
        keys = [self._keys.joiner(rnd, i) for i in range(size)]
        if not store.check(keys):
            return  # an arrival has not written its line yet (a get would block on it)
        lines = store.multi_get(keys)
        outcome = outcome_of([Joiner.decode(x) for x in lines])
        self._decide(store, rnd, outcome.encode())

    def _backup_due(self, rnd: int) -> bool:
        """The keep-alive thread's turn to close round `rnd`: two keep-alive intervals after it first saw
        the round closable (the node that made it so closes it at once; N backups reading every arrival's
        line at once cost the store O(N^2): measured at 1,024 nodes before this wait)."""
        first = self._closable_since.setdefault(rnd, time.monotonic())
        return time.monotonic() - first >= 2 * self._settings.keep_alive

    def _decide(self, store: Any, rnd: int, value: str) -> None:
        """Set the round's outcome unless one is set already (the first wins), then wake the waiting nodes."""
        store.compare_set(self._keys.done(rnd), "", value)
        store.set(self._keys.wake(rnd), "1")

    def _quorum_time(self, rnd: int, store: Any) -> float:
        """When the round reached min_nodes (infinity while the arrival that did has not said so)."""
        if rnd not in self._quorum_at:
            key = self._keys.quorum_at(rnd)
            if not store.check([key]):
                return float("inf")
            self._quorum_at[rnd] = float(store.get(key))
        return self._quorum_at[rnd]

    def _all_expected(self, rnd: int, joined: int, store: Any) -> bool:
        """Every node of the previous round that is still alive has joined this one (the leader's
        check; the slots read once, each arrival's line once, the absent nodes' heartbeats each time)."""
        if rnd == 0:
            return False
        if rnd not in self._previous:
            previous = self._read_outcome_of(rnd - 1, store)
            lines = store.multi_get([self._keys.joiner(rnd - 1, i) for i in range(previous.size)]) if previous else []
            self._previous[rnd] = [Joiner.decode(x).slot for x in lines]
            self._arrived[rnd] = set()
        arrived = self._arrived[rnd]
        seen = len(arrived)
        if joined > seen:
            arrived.update(Joiner.decode(x).slot for x in
                           store.multi_get([self._keys.joiner(rnd, i) for i in range(seen, joined)]))
        absent = [s for s in self._previous[rnd] if s not in arrived]
        if not absent:
            return True
        beats = dict(zip(absent, store.multi_get([self._keys.heartbeat(s) for s in absent])))
        return not missing_alive(absent, arrived, beats, time.time(), self._settings.expiry)

    def _read_outcome_of(self, rnd: int, store: Any) -> Outcome | None:
        raw = store.get(self._keys.done(rnd))
        text = raw.decode() if isinstance(raw, bytes) else raw
        return None if text in (CLOSED, TIMED_OUT) else Outcome.decode(text)

    # --- keep-alive ------------------------------------------------------------------------------

    def _beat(self, store: Any = None) -> None:
        (store or self._store).set(self._keys.heartbeat(self._slot), repr(time.time()))

    def _start_heartbeats(self) -> None:
        if self._beat_thread is not None and self._beat_thread.is_alive():
            return
        self._stop.clear()
        self._beat_thread = threading.Thread(target=self._beats, name=f"resctl-rdzv-keepalive-{self._slot}",
                                             daemon=True)
        self._beat_thread.start()

    def _beats(self) -> None:
        while not self._stop.wait(self._settings.keep_alive):
            try:
                self._beat(self._beat_store)
                waiting = self._waiting_in
                if waiting is not None:  # help close it (the leader may be gone): max and last-call rules
                    self._try_close(waiting, leader=False, deadline=float("inf"), store=self._beat_store)
                watch = self._watch
                if watch is not None and not self._peer_lost:
                    self._look_at(watch, self._beat_store)
            except Exception as err:  # noqa: BLE001 - a missed beat is what the expiry allows for
                log.debug("rendezvous keep-alive failed: %s", err)

    def _watch_in(self, rnd: int, index: int, size: int) -> PeerWatch | None:
        """The watch of the member after this node in round `rnd`'s arrival order (None: a world of one)."""
        other = watched(index, size)
        if other is None:
            return None
        slot = Joiner.decode(_text(self._store.get(self._keys.joiner(rnd, other)))).slot
        s = self._settings
        return PeerWatch(slot, after=2 * s.expiry, stall=2 * s.keep_alive, rnd=rnd)

    def _look_at(self, watch: PeerWatch, store: Any) -> None:
        """One look at the watched member's keep-alive; lost (and the job not ended): the next round opens."""
        if not watch.lost(store.get(self._keys.heartbeat(watch.slot)), time.monotonic()):
            return
        if watch is not self._watch or store.check([self._keys.closed]):
            return  # a new round began meanwhile, or the job ended (its nodes stop beating as they leave)
        log.warning("rendezvous %r: the node in slot %s of round %s has sent no keep-alive for %gs: it is lost "
                    "(a machine that goes away tells no one); restarting the workers for a round without it",
                    self._settings.run_id, watch.slot, watch.rnd, watch.after)
        store.compare_set(self._keys.opened(watch.rnd + 1), "", "1")
        self._peer_lost = True  # after the round opened: whoever sees the flag sees the open round


def _second_client(store: Any) -> Any:
    """A new client of the TCPStore `store` (the store itself when it is another kind). A blocking
    `wait` holds a TCPStore client's connection, so the keep-alive cannot share the agent's. Made
    once, before the keep-alive thread starts: connecting while other threads of the process used the
    store stalled them all for 5 s here (and so did `clone()`)."""
    import torch.distributed as dist

    if not isinstance(store, dist.TCPStore):
        return store
    return dist.TCPStore(store.host, store.port, None, False, timeout=timedelta(seconds=60))


def before_round(handler: Any, worker_group: Any) -> None:
    """Before the agent's round: what this node's line in it says (its local world size and role)."""
    if isinstance(handler, OwnedRendezvousHandler):
        spec = worker_group.spec
        handler.local_world_size, handler.role = spec.local_world_size, spec.role


def gathered(handler: Any, spec: Any, group_world_size: int, info: Any) -> list[Any] | None:
    """Every node's role and local world size from the round's outcome (torch elastic's rank
    assignment gathers them from N keys otherwise); None when the outcome does not say (another
    handler, or nodes of several roles): the agent's own gather then. `info(role, rank, size)` builds
    one entry (the agent's `_RoleInstanceInfo`)."""
    outcome = getattr(handler, "_outcome", None) if isinstance(handler, OwnedRendezvousHandler) else None
    if outcome is None or outcome.role != spec.role or outcome.size != group_world_size:
        return None
    return [info(spec.role, r, outcome.local_world_sizes[r]) for r in range(outcome.size)]


def read_state(store: Any, run_id: str, min_nodes: int = 0, max_nodes: int = 0, expiry: float = 3.0) -> RoundState:
    """The rendezvous of `run_id` in `store` as a RoundState (what `OwnedRendezvousHandler.state`
    answers; the cluster preflight reads it with no handler of its own)."""
    keys = Keys(run_id)
    latest = int(store.compare_set(keys.current, "", "0"))
    rnd, outcome = latest, None
    while rnd >= 0 and outcome is None and latest - rnd < 8:  # rounds that timed out have no world
        if store.check([keys.done(rnd)]):
            raw = store.get(keys.done(rnd))
            text = raw.decode() if isinstance(raw, bytes) else raw
            outcome = None if text in (CLOSED, TIMED_OUT) else Outcome.decode(text)
        if outcome is None:
            rnd -= 1
    members: tuple[int, ...] = ()
    if outcome is not None:
        members = tuple(Joiner.decode(x).slot for x in
                        store.multi_get([keys.joiner(rnd, i) for i in range(outcome.size)]))
    else:
        rnd = -1
    registered = int(store.add(keys.members, 0))
    beats = [keys.heartbeat(s) for s in range(registered)]
    if beats and store.check(beats):
        values: list[bytes | str | None] = list(store.multi_get(beats))
    else:  # a member between its slot and its first beat: a get of its key would block
        values = [store.get(k) if store.check([k]) else None for k in beats]
    opened = keys.opened(rnd + 1)
    next_open = bool(store.check([opened])) and _text(store.get(opened)) != CLOSED
    return RoundState(rnd, members, spares_of(members, registered, values, time.time(), expiry),
                      min_nodes, max_nodes, next_open=next_open, closed=bool(store.check([keys.closed])))


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def mark_dead(store: Any, run_id: str, slot: int) -> None:
    """Say that member `slot` is gone (its `resctl run` saw the launcher die): restart rounds stop waiting for it."""
    store.set(Keys(run_id).heartbeat(slot), DEAD)


def mark_launcher_gone(run_dir: Any, launcher_pid: int, endpoint: str, run_id: str, code: int) -> bool:
    """After the launcher `launcher_pid` exited with `code`: drop its slot file and mark its slot in the
    rendezvous store: dead when it was killed (code < 0), so that the other nodes' restart round waits for
    no keep-alive of it to expire; left when it stopped on SIGTERM or SIGINT, which NVRx 0.4's launcher says
    itself but NVRx >= 0.6's does not, so that the other nodes' watch takes this node's stop for no loss.
    Other exits said so themselves (or closed the job). False when there was nothing to do or the store
    could not be reached (it may have died with this node: a refused port is given up at once)."""
    path = Path(run_dir) / SLOT_FILE.format(pid=launcher_pid)
    try:
        slot = int(path.read_text())
        path.unlink()
    except (OSError, ValueError):
        return False
    host, _, port = endpoint.rpartition(":")
    mark = DEAD if code < 0 else LEFT if code in (128 + signal.SIGTERM, 128 + signal.SIGINT) else None
    if mark is None or not port.isdigit() or int(port) == 0 or not _reachable(host.strip("[]") or "localhost", int(port)):
        return False
    try:
        import torch.distributed as dist

        store = dist.TCPStore(host.strip("[]") or "localhost", int(port), None, False, timeout=timedelta(seconds=2))
        store.set(Keys(run_id).heartbeat(slot), mark)
        return True
    except Exception as err:  # noqa: BLE001 - the store host may be gone with this node
        log.debug("could not mark rendezvous slot %s %s: %s", slot, mark, err)
        return False


def _reachable(host: str, port: int, timeout: float = 0.5) -> bool:
    """Something listens at host:port (torch's TCPStore client retries a refused port for its whole timeout,
    printing a C++ stack each time)."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False


def settings_from(params: Any, keep_alive: float, misses: int) -> _Settings:
    """The handler's settings from the launcher's RendezvousParameters (join/last_call timeouts as NVRx reads them)."""
    def seconds(key: str, default: float) -> float:
        value = params.get_as_int(key + "_timeout")
        return float(default if value is None else value)

    return _Settings(params.run_id, params.min_nodes, params.max_nodes, seconds("join", 600), seconds("last_call", 30),
                     keep_alive, misses, bool(params.config.get("upscaling_enabled", True)))
