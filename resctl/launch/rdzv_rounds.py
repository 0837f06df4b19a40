"""The owned rendezvous' rules, pure (no store, no clock): what a round's keys hold, when a round
closes, and which node gets which rank (issue 25; the handler that acts on them is
`resctl.launch.owned_rdzv`).

A round R is a counter and a few keys under the run's prefix (`keys`): a node joins by one `add`
(its arrival index) and one `set` (its `Joiner` line); the round closes when one node's
`compare_set` of the `done` key from empty to an `Outcome` succeeds, and every node reads that one
value. Nothing here holds the whole membership in one key that every node rewrites (NVRx 0.4.1's
rendezvous does that: O(N) compare-and-sets of an O(N) state per round).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from resctl.profile import contract

#: What the plan tells the launcher (resctl.launch.plan -> resctl.launch.adapters): which rendezvous,
#: its keep-alive interval (seconds) and how many missed keep-alives make a node gone.
IMPL_ENV, KEEP_ALIVE_ENV, MISSES_ENV = contract.RDZV, contract.RDZV_KEEP_ALIVE, contract.RDZV_MISSES
STORE_ENV = contract.RDZV_STORE
#: Where the launcher writes this node's member slot (`resctl run` marks it dead if the launcher dies).
SLOT_FILE = "rdzv-slot-{pid}"

#: Heartbeat values that are not a time: the node left (its agent said so) or was seen dead
#: (its `resctl run` saw the launcher die).
LEFT, DEAD = "left", "dead"


class Keys:
    """Every key of one run's rendezvous, relative to the store the agents share."""

    def __init__(self, run_id: str) -> None:
        self.base = f"resctl.rdzv.{run_id}"

    @property
    def current(self) -> str:  # the latest round opened (decimal text)
        return f"{self.base}/current"

    @property
    def closed(self) -> str:  # set: the job is over, no round opens again
        return f"{self.base}/closed"

    @property
    def members(self) -> str:  # counter: one slot per handler that ever joined
        return f"{self.base}/members"

    def heartbeat(self, slot: int) -> str:  # wall time of the slot's last keep-alive, or LEFT / DEAD
        return f"{self.base}/hb/{slot}"

    def joined(self, rnd: int) -> str:  # counter: arrivals in round rnd
        return f"{self.base}/r{rnd}/joined"

    def joiner(self, rnd: int, index: int) -> str:  # the Joiner line of arrival `index`
        return f"{self.base}/r{rnd}/n/{index}"

    def opened(self, rnd: int) -> str:  # set by the first arrival: wakes the spares
        return f"{self.base}/r{rnd}/open"

    def quorum_at(self, rnd: int) -> str:  # wall time at which the round reached min_nodes
        return f"{self.base}/r{rnd}/quorum_at"

    def done(self, rnd: int) -> str:  # the Outcome, set once (compare_set from empty)
        return f"{self.base}/r{rnd}/done"

    def wake(self, rnd: int) -> str:  # set after `done`: what waiting nodes wait on (a compare_set wakes no one)
        return f"{self.base}/r{rnd}/wake"

    @property
    def reason(self) -> str:  # why the job's rendezvous closed, set once (NVRx >= 0.6's agent asks)
        return f"{self.base}/reason"


@dataclass(frozen=True)
class Joiner:
    """What one arrival tells the round: its member slot, the round and rank it had last (-1: none),
    its local world size and role (what torch elastic's rank assignment gathers from every agent)."""

    slot: int
    last_round: int
    last_rank: int
    local_world_size: int
    role: str

    def encode(self) -> str:
        return f"{self.slot},{self.last_round},{self.last_rank},{self.local_world_size},{self.role}"

    @classmethod
    def decode(cls, raw: bytes | str) -> Joiner:
        text = raw.decode() if isinstance(raw, bytes) else raw
        slot, last_round, last_rank, lws, role = text.split(",", 4)
        return cls(int(slot), int(last_round), int(last_rank), int(lws), role)


@dataclass(frozen=True)
class Outcome:
    """A closed round: arrival i (i < size) has group rank ranks[i]; `local_world_sizes[r]` is what the
    node of group rank r runs; `role` is every node's role ("" when they differ: torch's gather then)."""

    ranks: tuple[int, ...]
    local_world_sizes: tuple[int, ...]
    role: str

    @property
    def size(self) -> int:
        return len(self.ranks)

    def encode(self) -> str:
        sizes = set(self.local_world_sizes)
        lws = str(next(iter(sizes))) if len(sizes) == 1 else ":".join(map(str, self.local_world_sizes))
        return f"v1|{self.role}|{lws}|" + ",".join(map(str, self.ranks))

    @classmethod
    def decode(cls, raw: bytes | str) -> Outcome:
        text = raw.decode() if isinstance(raw, bytes) else raw
        version, role, lws, ranks_text = text.split("|", 3)
        if version != "v1":
            raise ValueError(f"unknown rendezvous outcome {text[:40]!r}")
        ranks = tuple(int(r) for r in ranks_text.split(",")) if ranks_text else ()
        sizes = tuple(int(x) for x in lws.split(":")) if ":" in lws else (int(lws),) * len(ranks)
        return cls(ranks, sizes, role)


def assign_ranks(joiners: list[Joiner]) -> tuple[int, ...]:
    """Group ranks for the arrivals in order: a node keeps the rank it had last when that rank still
    exists and no earlier arrival claimed it (as NVRx's `_assign_ranks` keeps the previous round's);
    then a node new to the job (`last_round` -1) gets the rank it asks for (`last_rank`: the store host
    asks for 0) where nobody kept it; the others fill the free ranks in arrival order."""
    size = len(joiners)
    ranks = [-1] * size
    taken: set[int] = set()
    for kept in (True, False):
        for i, j in enumerate(joiners):
            if (j.last_round >= 0) == kept and 0 <= j.last_rank < size and j.last_rank not in taken:
                ranks[i] = j.last_rank
                taken.add(j.last_rank)
    free = iter(r for r in range(size) if r not in taken)
    return tuple(r if r >= 0 else next(free) for r in ranks)


def outcome_of(joiners: list[Joiner]) -> Outcome:
    """The round's outcome for these participants (the first `size` arrivals)."""
    ranks = assign_ranks(joiners)
    lws = [0] * len(joiners)
    for j, r in zip(joiners, ranks):
        lws[r] = j.local_world_size
    roles = {j.role for j in joiners}
    return Outcome(ranks, tuple(lws), roles.pop() if len(roles) == 1 else "")


def close_size(joined: int, min_nodes: int, max_nodes: int, *, past_last_call: bool, all_expected: bool) -> int | None:
    """How many arrivals the round closes with now, or None to wait: max_nodes as soon as that many
    came; otherwise, with at least min_nodes, when every node of the previous round that is still
    alive has come (a restart: waiting longer admits no one expected) or the last call is over."""
    if joined >= max_nodes:
        return max_nodes
    if joined >= min_nodes and (all_expected or past_last_call):
        return joined
    return None


def is_alive(value: bytes | str | None, now: float, expiry: float) -> bool:
    """A heartbeat value: alive when it is a time no older than `expiry` seconds (LEFT/DEAD: not)."""
    if value is None:
        return False
    text = value.decode() if isinstance(value, bytes) else value
    if text in (LEFT, DEAD):
        return False
    try:
        return now - float(text) <= expiry
    except ValueError:
        return False


class PeerWatch:
    """While a round trains: whether the member this node watches (`watched`: the next in the round's arrival
    order, so every member has one watcher) is lost, judged on this node's own clock, never against another
    host's: its heartbeat value has not changed for `after` seconds of this node's looks. DEAD: lost at once;
    LEFT: it left on purpose (its stop, the job's end), never lost. A look `stall` seconds or more after the
    previous one (this node was stalled itself) judges nothing and starts the count again."""

    def __init__(self, slot: int, after: float, stall: float, rnd: int = 0) -> None:
        self.slot, self.after, self.stall, self.rnd = slot, after, stall, rnd  # rnd: the round it is watched in
        self._value: str | None = None
        self._since = self._looked = -1.0

    def lost(self, value: bytes | str | None, now: float) -> bool:
        text = value.decode() if isinstance(value, bytes) else value
        if text in (LEFT, DEAD):
            return text == DEAD
        stalled = self._looked >= 0 and now - self._looked >= self.stall
        self._looked = now
        if self._since < 0 or stalled or text != self._value:
            self._value, self._since = text, now
            return False
        return now - self._since >= self.after


def watched(index: int, size: int) -> int | None:
    """The arrival index the member of arrival `index` watches in a round of `size` (None: alone)."""
    return (index + 1) % size if size > 1 else None


def missing_alive(previous: list[int], arrived: set[int], heartbeats: dict[int, bytes | str | None], now: float,
                  expiry: float) -> list[int]:
    """The previous round's member slots that have not arrived and still look alive."""
    return [s for s in previous if s not in arrived and is_alive(heartbeats.get(s), now, expiry)]


@dataclass(frozen=True)
class RoundState:
    """The rendezvous as the features outside it read it (the spare's lines, the decision after a
    peer's stop, the cluster preflight's wait for the tested nodes): the latest round that closed with
    a world, its members (slots, in arrival order), the live members outside it (spares waiting, or
    nodes already in the next round), whether a later round has opened (a restart is under way), and
    whether the job's rendezvous is closed for good."""

    round: int  # -1: no round has closed with a world yet
    members: tuple[int, ...]
    spares: tuple[int, ...]
    min_nodes: int
    max_nodes: int
    next_open: bool = False
    closed: bool = False

    @property
    def size(self) -> int:
        return len(self.members)

    def full_with(self, nodes: int) -> bool:
        """A round of at least `nodes` nodes has closed (the preflight's tested nodes train)."""
        return self.round >= 0 and self.size >= nodes


@runtime_checkable
class RendezvousView(Protocol):
    """What resctl's rendezvous handler answers about itself (`OwnedRendezvousHandler.state`)."""

    def state(self) -> RoundState: ...


def spares_of(members: tuple[int, ...], registered: int, heartbeats: list[bytes | str | None], now: float,
              expiry: float) -> tuple[int, ...]:
    """The slots among 0..registered-1 that are alive (`heartbeats[slot]`) and not `members`."""
    inside = set(members)
    return tuple(s for s in range(registered)
                 if s not in inside and s < len(heartbeats) and is_alive(heartbeats[s], now, expiry))
