"""The memory tier's slot policy as pure code (resctl.slots): no torch, no files."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from resctl import slots

slot = st.integers(0, slots.SLOTS - 1)


def test_a_fresh_rank_writes_slot_0_first_then_alternates() -> None:
    first = slots.choose(slots.last_written(None), None)
    assert first == 0
    assert slots.choose(first, None) == 1 and slots.choose(1, None) == 0


@given(last=slot)
def test_the_next_snapshot_never_overwrites_the_newest(last: int) -> None:
    assert slots.choose(last, None) != last
    assert slots.choose(last, last) != last  # the newest is being sent: still the other slot


@given(last=slot)
def test_the_slot_being_sent_is_kept_by_overwriting_the_newest(last: int) -> None:
    other = slots.after(last)
    assert slots.choose(last, other) == last


@given(newest=st.none() | slot)
def test_a_fetch_from_the_buddy_never_lands_on_the_newest_local_snapshot(newest: int | None) -> None:
    target = slots.fetch_slot(newest)
    assert 0 <= target < slots.SLOTS
    assert target != newest


@given(held=st.lists(st.none() | st.integers(0, 10**6), min_size=slots.SLOTS, max_size=slots.SLOTS))
def test_a_received_copy_keeps_the_newest_copy_held(held: list[int | None]) -> None:
    target = slots.receive_slot(held)
    kept = [s for s in held if s is not None]
    if not kept:
        assert target == 0
    else:
        newest = held.index(max(kept))
        assert target == slots.after(newest) and target != newest


def test_the_shm_budget_is_the_slots_plus_a_restored_state_and_the_buddy_slots() -> None:
    assert (slots.LOCAL_COPIES, slots.BUDDY_COPIES) == (slots.SLOTS + 1, slots.SLOTS)
    assert (slots.shm_factor(False), slots.shm_factor(True)) == (3, 5)


def test_the_ranks_compare_their_slots_and_with_replication_the_buddy_copies() -> None:
    assert (slots.compared_steps(False), slots.compared_steps(True)) == (slots.SLOTS, 2 * slots.SLOTS)


def test_claims_hand_back_the_reader_once() -> None:
    claims: slots.Claims[str] = slots.Claims()
    claims.claim(1, "disk write")
    assert claims.held() == [1]
    assert claims.release(1) == "disk write"
    assert claims.release(1) is None and claims.held() == []


def test_the_schema_and_doctor_state_the_same_multiplier() -> None:
    from resctl.doctor import shm
    from resctl.profile.schema import Checkpoint

    text = Checkpoint.model_fields["memory_every"].description or ""
    assert f"{slots.LOCAL_COPIES}x the state per rank" in text
    assert f"{slots.BUDDY_COPIES}x" in (Checkpoint.model_fields["memory_replicate"].description or "")
    assert shm.slots is slots  # doctor's budget is slots.shm_factor
