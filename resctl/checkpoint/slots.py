"""The memory tier's slot policy under its old name: the facts live in `resctl.slots` (the bottom
layer, so the profile schema and the checkpoint engine both import them downward)."""

from resctl.slots import (
    BUDDY_COPIES,
    LOCAL_COPIES,
    SLOTS,
    Claims,
    after,
    choose,
    compared_steps,
    fetch_slot,
    last_written,
    receive_slot,
    shm_factor,
)

__all__ = [
    "BUDDY_COPIES", "LOCAL_COPIES", "SLOTS", "Claims", "after", "choose", "compared_steps", "fetch_slot",
    "last_written", "receive_slot", "shm_factor",
]
