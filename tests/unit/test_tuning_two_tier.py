"""resctl.tuning.two_tier: memory interval from the copy, disk interval from node faults only."""

from __future__ import annotations

import math

import pytest

from resctl.tuning.model import Costs, daly_interval, recommend
from resctl.tuning.two_tier import plan

DISK = Costs(step_time=1.0, stall=0.12, write=6.0, restart=60.0)


def test_memory_interval_is_daly_on_the_copy_and_disk_a_multiple_of_it() -> None:
    p = plan(step_time=1.0, mem_stall=0.1, mem_commit=0.3, disk=DISK, process_mtbf=3600, node_mtbf=86400)
    assert p.memory_rule == "daly"
    assert p.memory_every == math.ceil(daly_interval(0.1, 3600))  # ~27 s of compute at 1 s a step
    assert p.interval_steps % p.memory_every == 0
    single_node = recommend(Costs(**{**DISK.__dict__, "mtbf": 86400})).interval_steps
    assert single_node <= p.interval_steps < single_node + p.memory_every
    # The disk now answers only to node faults: a longer interval than one tier facing every fault.
    every_fault = recommend(Costs(**{**DISK.__dict__, "mtbf": 1 / (1 / 3600 + 1 / 86400)})).interval_steps
    assert p.interval_steps > every_fault
    assert p.expected_loss_process_s == pytest.approx(p.memory_every / 2)
    assert 0.99 < p.memory_efficiency < 1


def test_the_commit_time_floors_the_memory_interval() -> None:
    p = plan(step_time=0.5, mem_stall=1e-4, mem_commit=5.0, disk=DISK, process_mtbf=3600, node_mtbf=86400)
    assert p.memory_rule == "commit" and p.memory_every == math.ceil(1.2 * 5.0 / 0.5)


def test_every_step_when_snapshots_are_cheap_against_a_slow_step() -> None:
    p = plan(step_time=120.0, mem_stall=0.05, mem_commit=0.2, disk=DISK, process_mtbf=3600, node_mtbf=86400)
    assert p.memory_every == 1


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError):
        plan(step_time=0, mem_stall=0.1, mem_commit=0.1, disk=DISK, process_mtbf=1, node_mtbf=1)
