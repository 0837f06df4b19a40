"""resctl.tuning.two_tier: memory interval from the copy, disk interval from node faults, within a budget."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as hs

from resctl.tuning.model import Costs, daly_interval, evaluate, recommend
from resctl.tuning.two_tier import MemoryCosts, hold, overhead, plan

DISK = Costs(step_time=1.0, stall=0.12, write=6.0, restart=60.0)


def test_memory_interval_is_daly_on_the_copy_and_disk_a_multiple_of_it() -> None:
    p = plan(MemoryCosts(0.1, 0.3), DISK, process_mtbf=3600, node_mtbf=86400)
    assert p.memory_rule == "daly" and p.feasible
    assert p.memory_every == math.ceil(daly_interval(0.1, 3600))  # ~27 s of compute at 1 s a step
    assert p.interval_steps % p.memory_every == 0
    single_node = recommend(Costs(**{**DISK.__dict__, "mtbf": 86400})).interval_steps
    assert p.disk_only_interval == single_node
    assert single_node <= p.interval_steps < single_node + p.memory_every
    # The disk now answers only to node faults: a longer interval than one tier facing every fault.
    every_fault = recommend(Costs(**{**DISK.__dict__, "mtbf": 1 / (1 / 3600 + 1 / 86400)})).interval_steps
    assert p.interval_steps > every_fault
    assert p.steps_lost_process == pytest.approx(p.memory_every / 2 + 0.3)
    assert p.steps_lost_node == pytest.approx(evaluate(p.interval_steps, Costs(**{**DISK.__dict__, "mtbf": 86400})).steps_lost)
    assert p.overhead == pytest.approx(overhead(p.memory_every, p.interval_steps, MemoryCosts(0.1, 0.3), DISK)[0])


def test_the_commit_time_floors_the_memory_interval() -> None:
    p = plan(MemoryCosts(1e-4, 5.0), Costs(step_time=0.5, stall=0.01, write=6.0), process_mtbf=3600, node_mtbf=86400)
    assert p.memory_rule == "commit" and p.memory_every == math.ceil(1.2 * 5.0 / 0.5)


def test_a_copy_longer_than_a_step_snapshots_every_few_steps() -> None:
    """The GPU case of issue 15: the copy (host staging, or the background copy with device staging)
    takes longer than a step, so the compute between snapshots must be >= 1.2x it."""
    step, copy = 0.08, 0.12
    p = plan(MemoryCosts(0.01, copy), Costs(step_time=step, stall=0.005, write=4.0), process_mtbf=3600,
             node_mtbf=86400)
    assert p.memory_every > 1 and p.memory_every * step >= 1.2 * copy
    assert p.feasible and p.overhead <= 0.01


def test_the_budget_lengthens_the_memory_interval() -> None:
    p = plan(MemoryCosts(2.0, 0.3), DISK, process_mtbf=3600, node_mtbf=86400, max_overhead=0.01)
    assert p.memory_rule == "budget" and p.feasible and p.overhead <= 0.01
    assert p.memory_every > math.ceil(daly_interval(2.0, 3600))
    looser = plan(MemoryCosts(2.0, 0.3), DISK, process_mtbf=3600, node_mtbf=86400, max_overhead=0.05)
    assert looser.memory_every < p.memory_every


def test_every_step_when_snapshots_are_cheap_against_a_slow_step() -> None:
    p = plan(MemoryCosts(0.05, 0.2), Costs(step_time=120.0, stall=0.12, write=6.0), process_mtbf=3600,
             node_mtbf=86400)
    assert p.memory_every == 1


def test_no_process_faults_one_snapshot_per_disk_write() -> None:
    p = plan(MemoryCosts(0.1, 0.3), DISK, process_mtbf=math.inf, node_mtbf=86400)
    assert p.memory_rule == "disk-source" and p.memory_every == p.interval_steps
    assert p.to_json()["process_mtbf"] is None


def test_out_of_budget_says_so() -> None:
    p = plan(MemoryCosts(10.0, 0.3), DISK, process_mtbf=20, node_mtbf=30)
    assert not p.feasible and p.overhead > p.max_overhead and "no plan keeps the overhead" in p.warnings[0]


@pytest.mark.parametrize("kw", [dict(process_mtbf=0, node_mtbf=1), dict(process_mtbf=1, node_mtbf=math.inf),
                                dict(process_mtbf=1, node_mtbf=-1), dict(process_mtbf=1, node_mtbf=1, max_overhead=0),
                                dict(process_mtbf=1, node_mtbf=1, max_overhead=1.5)])
def test_bad_inputs_are_refused(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        plan(MemoryCosts(0.1, 0.1), DISK, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("stall, commit", [(-1.0, 0.0), (math.nan, 0.0), (0.0, math.inf)])
def test_bad_memory_costs_are_refused(stall: float, commit: float) -> None:
    with pytest.raises(ValueError, match="memory snapshot"):
        MemoryCosts(stall, commit)


steps = hs.floats(min_value=1e-3, max_value=1e3)  # a time as a number of step times


@settings(max_examples=300, deadline=None)
@given(t=hs.floats(0.01, 10.0), s_m=hs.floats(0.0, 5.0), commit=hs.floats(0.0, 20.0), s_d=hs.floats(0.0, 2.0),
       write=hs.floats(0.0, 150.0), k=hs.floats(1.0, 3.0), m_p=steps, n_p=steps,
       budget=hs.floats(0.001, 0.5), sync=hs.booleans())
def test_plan_properties(t: float, s_m: float, commit: float, s_d: float, write: float, k: float, m_p: float,
                         n_p: float, budget: float, sync: bool) -> None:
    """memory_every <= interval_steps, a multiple; the commit floor holds; within the budget
    whenever some plan within the MTBF caps is (brute force over every pair when they are small)."""
    s_m, commit, s_d, write = s_m * t, commit * t, s_d * t, write * t
    process_mtbf, node_mtbf = m_p * t, n_p * t
    mode = "sync" if sync else "async"
    disk = Costs(step_time=t, stall=s_d, write=write, write_slowdown=k)
    mem = MemoryCosts(s_m, commit)
    p = plan(mem, disk, process_mtbf=process_mtbf, node_mtbf=node_mtbf, mode=mode, max_overhead=budget)
    m, n = p.memory_every, p.interval_steps
    assert 1 <= m <= n and n % m == 0
    assert m * t >= 1.2 * commit - 1e-9 * max(1.0, commit)
    assert p.feasible == (p.overhead <= budget)
    assert 0 <= p.overhead_memory <= p.overhead + 1e-12 and p.overhead < 1
    costs = Costs(step_time=t, stall=s_d, write=write, write_slowdown=k, mtbf=node_mtbf)
    n0 = recommend(costs, mode=mode).interval_steps
    floor = max(1, math.ceil(1.2 * commit / t - 1e-9))
    n_cap = max(n0, int(node_mtbf // t), floor)
    m_cap = max(floor, min(n_cap, int(process_mtbf // t)))
    assume(n_cap <= 400)
    exists = any(overhead(a, b, mem, costs, mode)[0] <= budget
                 for a in range(floor, m_cap + 1) for b in range(a, n_cap + 1, a))
    event(f"a plan within the budget exists: {exists}")
    if exists:
        assert p.feasible, (p, n_cap, m_cap)


@settings(max_examples=100, deadline=None)
@given(t=hs.floats(0.01, 10.0), s_m=hs.floats(0.0, 5.0), write=hs.floats(0.0, 100.0), k=hs.floats(1.0, 3.0),
       m=hs.integers(1, 50), j=hs.integers(1, 20), sync=hs.booleans())
def test_overhead_never_grows_with_either_interval(t: float, s_m: float, write: float, k: float, m: int, j: int,
                                                   sync: bool) -> None:
    """What the search relies on: longer disk intervals (same m) and longer memory intervals
    dividing the same n never cost more."""
    mode = "sync" if sync else "async"
    disk = Costs(step_time=t, stall=0.01, write=write, write_slowdown=k)
    mem = MemoryCosts(s_m, 0.0)
    tol = 1e-12
    assert overhead(m, m * (j + 1), mem, disk, mode)[0] <= overhead(m, m * j, mem, disk, mode)[0] + tol
    n = m * j * 2
    assert overhead(2 * m, n, mem, disk, mode)[0] <= overhead(m, n, mem, disk, mode)[0] + tol


def test_a_commit_longer_than_the_steps_between_snapshots_costs_its_back_pressure_hold() -> None:
    """Issue 31: the step ending in the next snapshot waits for what is left of the commit, so a
    snapshot's true cost is its stall plus max(0, C - (m - 1) t), and nothing more once covered."""
    step, commit = 0.0145, 0.22
    disk = Costs(step_time=step, stall=0.01, write=6.0)
    mem = MemoryCosts(0.011, commit)
    for m in (1, 4, 16, 17, 76):
        assert hold(m, mem, step) == pytest.approx(max(0.0, commit - (m - 1) * step))
    _, mem_short = overhead(4, 400, mem, disk)
    _, mem_long = overhead(76, 760, mem, disk)
    assert mem_short > 10 * mem_long  # 0.011 + 0.18 s per 4 steps against 0.011 s per 76
    assert hold(76, mem, step) == 0 and mem_long <= 0.011 / (76 * step)


def test_advise_plans_both_tiers_with_memory_numbers_and_says_why_not_without() -> None:
    """resctl.tuning.advise: the typed advice the CLI renders (the CLI's own tests check the text)."""
    from resctl.tuning.advise import advise
    from resctl.tuning.inputs import Inputs, MemoryInputs

    given = Inputs(step_time=1.0, stall=0.12, write_time=6.0, restart=60.0, mtbf_per_node=86400.0, nodes=4,
                   interval=100)
    both = advise(given, MemoryInputs(stall=0.1, commit=0.3, memory_every=10), None, 0.01)
    assert both.two_tier is not None and both.memory is not None and both.skipped is None
    assert both.values == {"interval_steps": both.two_tier.interval_steps, "memory_every": both.two_tier.memory_every}
    assert both.current is not None and not isinstance(both.current, str)  # 100 is a multiple of 10
    assert (both.current.memory_every, both.current.interval_steps) == (10, 100)
    assert both.to_json()["profile"] == both.values and both.sources["step_time"]
    odd = advise(given, MemoryInputs(stall=0.1, commit=0.3, memory_every=30), None, 0.01)
    assert isinstance(odd.current, str) and "not a multiple" in odd.current
    disk = advise(given, MemoryInputs(), None, 0.01)
    assert disk.two_tier is None and disk.skipped and disk.values == {"interval_steps": disk.recommendation.interval_steps}
    assert disk.to_json()["two_tier_skipped"] == disk.skipped
