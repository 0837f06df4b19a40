"""An in-process restart's reset of process-wide state (`resctl.shim.fresh`), in this real interpreter."""

from __future__ import annotations

import random

import torch
import torch.distributed.tensor._random as dtensor_random

from resctl.shim.fresh import FreshState


def test_restore_puts_the_generators_and_the_dtensor_tracker_back_as_a_new_process_has_them() -> None:
    before = dtensor_random._rng_tracker
    state = FreshState.capture()
    expected = (random.random(), torch.rand(3))
    random.random(), torch.rand(3)
    dtensor_random._rng_tracker = object()  # type: ignore[assignment]  # what a failed iteration's first random DTensor op leaves
    try:
        done = state.restore()
        assert dtensor_random._rng_tracker is None and "dtensor rng tracker" in done
        assert random.random() == expected[0] and torch.equal(torch.rand(3), expected[1])
    finally:
        dtensor_random._rng_tracker = before
