"""The memory tier's slot policy, as pure code (no torch, no files): how many slots a rank has,
which one the next snapshot, a fetch from the buddy or a received buddy copy goes to, how many
steps the ranks compare, what a node needs in /dev/shm, and which slots a reader holds.

`resctl.checkpoint.memory` (a rank's own slots), `resctl.checkpoint.replica` (the buddy copies a
node's server keeps), the engine's load (`tiers`), the profile schema's text and `resctl doctor`
all take these facts from here; tests/unit/test_checkpoint_slots.py checks them as plain functions.

**Double buffering.** A snapshot goes into the slot that does not hold the newest complete one,
so a kill at any moment leaves that newest one intact. One exception: while the buddy sender is
reading the other slot, the newest's slot is overwritten instead (the snapshot being sent stays
complete and is what a kill during the copy falls back to): `choose`.

**/dev/shm.** A rank holds its `SLOTS` slots and, after a zero-copy restore on the CPU, the
restored state in a detached slot's shared pages until that slot's replacement is written:
`LOCAL_COPIES` copies of its state. A node's replica server keeps `BUDDY_COPIES` more of each
rank of its buddy node (`checkpoint.memory_replicate`).
"""

from __future__ import annotations

from typing import Generic, TypeVar

SLOTS = 2
#: Copies of a rank's state in /dev/shm at most: the slots, and a restored state in shared pages.
LOCAL_COPIES = SLOTS + 1
#: Copies of another node's rank this node's replica server keeps (its double-buffered slots).
BUDDY_COPIES = SLOTS


def shm_factor(replicated: bool) -> int:
    """Multiples of a node's state the memory tier needs in the node's /dev/shm."""
    return LOCAL_COPIES + (BUDDY_COPIES if replicated else 0)


def after(slot: int) -> int:
    """The other slot: the one after `slot` in the ring."""
    return (slot + 1) % SLOTS


def last_written(newest: int | None) -> int:
    """The slot to count as written last when a process starts: the newest complete one's, else
    the last slot (so the first snapshot goes to slot 0)."""
    return SLOTS - 1 if newest is None else newest


def choose(last: int, sending: int | None) -> int:
    """The slot the next local snapshot goes to, given the slot written `last` and the slot the
    buddy sender is reading (None: none): the other slot, unless that one is being sent."""
    target = after(last)
    return last if sending == target and last != target else target


def fetch_slot(newest: int | None) -> int:
    """The local slot a snapshot fetched back from the buddy goes to: not the newest local one's."""
    return after(last_written(newest))


def receive_slot(held: list[int | None]) -> int:
    """The slot a replica server writes a received copy into, given the step each of its slots
    holds (None: empty, or newer than the copy and so dropped): after the newest it keeps."""
    steps = [-1 if step is None else step for step in held]
    newest = max(range(len(steps)), key=steps.__getitem__)  # the first of equal steps
    return after(newest) if steps[newest] >= 0 else 0


def compared_steps(replicated: bool) -> int:
    """How many steps each rank offers when the ranks look for a snapshot they all hold: its own
    slots, and with replication the buddy's copies too."""
    return 2 * SLOTS if replicated else SLOTS


H = TypeVar("H")


class Claims(Generic[H]):
    """Which slots a reader holds (a disk write from a snapshot, a slot's background refill):
    `claim` records a reader's handle, `release` takes it back (the caller waits on it before the
    slot is overwritten). One handle per slot; a newer claim replaces an older one."""

    def __init__(self) -> None:
        self._held: list[H | None] = [None] * SLOTS

    def claim(self, slot: int, handle: H) -> None:
        self._held[slot] = handle

    def release(self, slot: int) -> H | None:
        handle, self._held[slot] = self._held[slot], None
        return handle

    def held(self) -> list[int]:
        return [k for k, h in enumerate(self._held) if h is not None]
