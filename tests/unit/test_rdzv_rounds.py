"""resctl's rendezvous rules (resctl.launch.rdzv_rounds), pure: keys, outcome, ranks, closing, liveness."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resctl.launch.rdzv_rounds import (
    DEAD,
    LEFT,
    Joiner,
    Keys,
    Outcome,
    PeerWatch,
    assign_ranks,
    close_size,
    is_alive,
    missing_alive,
    outcome_of,
    watched,
)


def _j(slot: int, last_rank: int = -1, lws: int = 8, role: str = "default") -> Joiner:
    return Joiner(slot, 0 if last_rank >= 0 else -1, last_rank, lws, role)


def test_a_joiner_line_round_trips() -> None:
    j = Joiner(7, 3, 2, 8, "default")
    assert Joiner.decode(j.encode().encode()) == j
    assert Joiner.decode(Joiner(0, -1, -1, 1, "a,b").encode()).role == "a,b"  # the role is the last field


def test_an_outcome_round_trips_and_stays_small() -> None:
    same = Outcome((1, 0, 2), (8, 8, 8), "default")
    assert Outcome.decode(same.encode().encode()) == same
    assert same.encode() == "v1|default|8|1,0,2"  # one local world size when all nodes agree
    mixed = Outcome((0, 1), (8, 4), "default")
    assert Outcome.decode(mixed.encode()) == mixed
    big = Outcome(tuple(range(1024)), (8,) * 1024, "default")
    assert len(big.encode()) < 5 * 1024, "about 4 bytes per node, read once by each node"
    with pytest.raises(ValueError, match="unknown rendezvous outcome"):
        Outcome.decode("v9|x|1|0")


def test_ranks_are_kept_where_they_can_be_and_new_nodes_fill_the_gaps() -> None:
    # Node with rank 1 lost; its replacement (no rank) arrives first; the survivors keep theirs.
    assert assign_ranks([_j(9), _j(0, 0), _j(2, 2), _j(3, 3)]) == (1, 0, 2, 3)
    # A rank beyond the new world (it shrank) is given up; the first claimant of a rank keeps it.
    assert assign_ranks([_j(0, 3), _j(1, 0), _j(2, 0)]) == (1, 0, 2)
    assert sorted(assign_ranks([_j(i) for i in range(5)])) == list(range(5))


def test_the_outcome_maps_local_world_sizes_to_group_ranks() -> None:
    out = outcome_of([_j(5, 1, lws=4), _j(6, 0, lws=8)])
    assert out.ranks == (1, 0) and out.local_world_sizes == (8, 4) and out.role == "default"
    assert outcome_of([_j(0, role="a"), _j(1, role="b")]).role == "", "mixed roles: torch's gather decides"


@pytest.mark.parametrize(("joined", "past", "expected", "size"), [
    (4, False, False, 4),  # max came: close now, whatever else
    (5, False, False, 4),  # more than max: the first max arrivals
    (3, False, False, None),  # min reached, others may still come
    (3, True, False, 3),  # the last call is over
    (3, False, True, 3),  # every node of the last round that is alive came (a restart)
    (1, True, True, None),  # below min: never
])
def test_when_a_round_closes(joined: int, past: bool, expected: bool, size: int | None) -> None:
    assert close_size(joined, 2, 4, past_last_call=past, all_expected=expected) == size


def test_liveness_of_a_heartbeat() -> None:
    assert is_alive(b"100.0", now=102.0, expiry=3.0)
    assert not is_alive(b"100.0", now=104.0, expiry=3.0)
    assert not is_alive(LEFT, now=100.0, expiry=3.0) and not is_alive(DEAD.encode(), now=100.0, expiry=3.0)
    assert not is_alive(None, now=0, expiry=1) and not is_alive(b"garbage", now=0, expiry=1)
    beats = {1: b"99.5", 2: DEAD, 3: b"90.0"}
    assert missing_alive([0, 1, 2, 3], {0}, beats, now=100.0, expiry=3.0) == [1]


def test_a_watched_member_is_lost_when_its_beat_stops_changing_on_the_watchers_clock() -> None:
    w = PeerWatch(slot=4, after=6.0, stall=2.0)
    assert not any(w.lost(f"{1000 + t}.0", now=float(t)) for t in range(20))  # beating; its clock is not ours
    assert not any(w.lost(b"1019.0", now=float(t)) for t in range(20, 25))
    assert w.lost(b"1019.0", now=25.0)  # unchanged for 6 s since we first saw it (at 19)
    stalled = PeerWatch(slot=4, after=6.0, stall=2.0)
    assert not stalled.lost(b"5.0", now=0.0) and not stalled.lost(b"5.0", now=10.0)  # we were stalled ourselves
    assert not any(stalled.lost(b"5.0", now=float(t)) for t in range(11, 16)) and stalled.lost(b"5.0", now=16.0)
    assert PeerWatch(1, 6.0, 2.0).lost(DEAD, now=0.0), "a member seen dead is lost at once"
    left = PeerWatch(1, 6.0, 2.0)
    assert not any(left.lost(LEFT.encode(), now=float(t)) for t in range(30)), "a member that left is not lost"
    assert watched(0, 3) == 1 and watched(2, 3) == 0 and watched(0, 1) is None


def test_keys_are_per_run_and_per_round() -> None:
    a, b = Keys("job-a"), Keys("job-b")
    assert a.done(1) != a.done(2) and a.done(1) != b.done(1)
    assert a.joiner(3, 0).startswith(a.base) and a.heartbeat(5).startswith(a.base)


def test_a_new_node_gets_the_rank_it_asks_for_after_the_kept_ones() -> None:
    """The store host asks for rank 0 in its first round (owned_rdzv `first_rank`): it gets it however late it
    arrives in a fresh job, but a rank kept from a previous round wins over the request, whatever the order."""
    host = Joiner(0, -1, 0, 8, "default")  # new to the job, asks for 0
    assert assign_ranks([_j(1), _j(2), host]) == (1, 2, 0)
    assert assign_ranks([host, _j(1), _j(2)]) == (0, 1, 2)
    assert assign_ranks([host, _j(5, 2), _j(6, 0)]) == (1, 2, 0)  # rank 0 was kept by slot 6


@given(st.lists(st.tuples(st.integers(-1, 3), st.integers(-1, 9)), min_size=1, max_size=12))
def test_ranks_are_a_permutation_and_kept_ranks_win(claims: list[tuple[int, int]]) -> None:
    joiners = [Joiner(i, last_round, last_rank, 1, "r") for i, (last_round, last_rank) in enumerate(claims)]
    ranks = assign_ranks(joiners)
    assert sorted(ranks) == list(range(len(joiners)))
    first_kept = {}
    for i, j in enumerate(joiners):
        if j.last_round >= 0 and 0 <= j.last_rank < len(joiners):
            first_kept.setdefault(j.last_rank, i)
    assert all(ranks[i] == r for r, i in first_kept.items())
