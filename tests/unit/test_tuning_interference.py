"""The write-interference term: a background write slows the steps it overlaps (c_w = k c_0).

A small simulator plays a job that obeys the model's assumptions exactly (one write in flight,
steps progress at 1/c_0 without a write and 1/c_w with one, a save waits for the previous write)
and writes the events the shim would; the calibration must recover c_0 and c_w from them, and
the model's cycle and steps lost must match the simulated ones.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

import pytest

from resctl.telemetry.goodput import analyze
from resctl.tuning.inputs import Inputs, assemble
from resctl.tuning.model import Costs, evaluate, optimum_steps, recommend


def simulate(c0: float, cw: float, stall: float, write: float, n: int, steps: int) -> dict[str, Any]:
    """Events of one rank plus the progress curve [(t, steps done)] and the durable saves [(t, step)]."""
    t = 0.0
    write_end = -math.inf
    events: list[dict[str, Any]] = [{"t": 0.0, "kind": "start", "rank": 0}]
    curve = [(0.0, 0.0)]
    durable: list[tuple[float, int]] = []
    saves: list[float] = []
    last = 0.0
    for step in range(1, steps + 1):
        remaining = 1.0
        while remaining > 1e-12:
            if t < write_end:
                if remaining * cw <= write_end - t:
                    t += remaining * cw
                    remaining = 0.0
                else:
                    remaining -= (write_end - t) / cw
                    t = write_end
            else:
                t += remaining * c0
                remaining = 0.0
            curve.append((t, step - remaining))
        events.append({"t": t, "kind": "step", "rank": 0, "step": step, "duration": t - last})
        if step % n == 0:
            wait = max(0.0, write_end - t)
            saves.append(t)
            t += wait + stall
            curve.append((t, float(step)))
            events.append({"t": t, "kind": "ckpt_stall", "rank": 0, "step": step, "seconds": wait + stall,
                           "waited": wait})
            write_end = t + write
            events.append({"t": write_end, "kind": "ckpt_persist", "rank": 0, "step": step, "seconds": write,
                           "bytes": 1e6})
            durable.append((write_end, step))
        last = t
    return {"events": events, "curve": curve, "durable": durable, "saves": saves}


def progress(curve: list[tuple[float, float]], x: float) -> float:
    i = bisect.bisect_right([p[0] for p in curve], x)
    (t0, s0), (t1, s1) = curve[i - 1], curve[min(i, len(curve) - 1)]
    return s0 if t1 <= t0 else s0 + (s1 - s0) * (x - t0) / (t1 - t0)


def simulated_steps_lost(sim: dict[str, Any]) -> tuple[float, float]:
    """(cycle, mean steps since the newest durable save) over one steady-state cycle."""
    a, b = sim["saves"][-4], sim["saves"][-3]
    grid = 4000
    lost = 0.0
    for i in range(grid):
        x = a + (b - a) * (i + 0.5) / grid
        newest = max((s for t, s in sim["durable"] if t <= x), default=0)
        lost += progress(sim["curve"], x) - newest
    return b - a, lost / grid


CASES = [  # c0, cw, stall, write, n: hidden write with partial overlap, exact fit, back-pressure
    (1.0, 2.0, 0.5, 3.0, 10),
    (1.0, 2.0, 0.5, 4.0, 10),
    (1.0, 2.0, 0.5, 5.0, 2),
    (0.05, 0.08, 0.004, 0.25, 3),
]


@pytest.mark.parametrize(("c0", "cw", "stall", "write", "n"), CASES)
def test_model_matches_a_job_that_obeys_it(c0: float, cw: float, stall: float, write: float, n: int) -> None:
    costs = Costs(step_time=c0, stall=stall, write=write, write_slowdown=cw / c0)
    pred = evaluate(n, costs)
    cycle, lost = simulated_steps_lost(simulate(c0, cw, stall, write, n, 12 * n))
    assert pred.cycle_s == pytest.approx(cycle, rel=1e-9)
    assert pred.efficiency == pytest.approx(n * c0 / cycle)
    assert pred.steps_lost == pytest.approx(lost, rel=2e-3)
    assert pred.regime == ("back-pressure" if n * cw < write else pred.regime)
    if n * cw >= write:
        assert pred.cycle_s == pytest.approx(stall + write + (n - write / cw) * c0)
    else:
        assert pred.cycle_s == pytest.approx(stall + write) and pred.wait_s == pytest.approx(write - n * cw)


def test_slowdown_one_is_the_plain_model() -> None:
    plain = Costs(step_time=2.8, stall=1.0, write=275.0)
    for n in (50, 98, 99, 100, 118, 1000):
        assert evaluate(n, plain) == evaluate(n, Costs(step_time=2.8, stall=1.0, write=275.0, write_slowdown=1.0))
        p = evaluate(n, plain)
        tau = n * 2.8
        assert p.cycle_s == pytest.approx(max(tau, 275.0) + 1.0)


def test_steps_lost_is_continuous_at_the_back_pressure_edge() -> None:
    costs = Costs(step_time=1.0, stall=0.5, write=4.0, write_slowdown=2.0)  # edge: n c_w = W at n = 2
    edge = evaluate(2, costs)
    assert edge.regime == "no-headroom" and edge.wait_s == 0.0 and edge.cycle_s == pytest.approx(4.5)
    hidden_side = Costs(step_time=1.0, stall=0.5, write=4.0 - 1e-9, write_slowdown=2.0)
    bp_side = Costs(step_time=1.0, stall=0.5, write=4.0 + 1e-9, write_slowdown=2.0)
    assert evaluate(2, bp_side).regime == "back-pressure"
    assert evaluate(2, hidden_side).steps_lost == pytest.approx(evaluate(2, bp_side).steps_lost, rel=1e-6)


def test_floor_and_blocking_cost_use_the_slowdown() -> None:
    costs = Costs(step_time=1.0, stall=0.5, write=12.0, mtbf=1e9, write_slowdown=2.0)
    assert costs.blocking("async") == pytest.approx(0.5 + 12.0 * 0.5)
    assert costs.blocking("sync") == pytest.approx(12.5)
    n, daly, floor, _ = optimum_steps(costs, "async")
    assert floor == pytest.approx(1.2 * 12.0 / 2.0)  # n c_w >= 1.2 W at c_w = 2 s
    assert evaluate(6, costs).regime == "no-headroom" and evaluate(5, costs).regime == "back-pressure"
    assert evaluate(8, costs).regime == "ok"
    rec = recommend(Costs(step_time=1.0, stall=0.5, write=12.0, mtbf=3600.0, write_slowdown=2.0), current=5)
    assert rec.current is not None and rec.current.regime == "back-pressure"
    assert "10 s while a write runs" in rec.warnings[0] and "use at least 8 steps" in rec.warnings[0]
    assert rec.to_json()["costs"]["write_slowdown"] == 2.0
    with pytest.raises(ValueError, match="slowdown"):
        Costs(step_time=1.0, stall=0.5, write=1.0, write_slowdown=0.9)


def test_calibration_recovers_c0_and_cw() -> None:
    sim = simulate(1.0, 2.0, 0.5, 3.0, 10, 80)
    cal = analyze(sim["events"]).calibration
    assert cal.step_time_idle == pytest.approx(1.0)
    assert cal.step_time_writing == pytest.approx(2.0)
    assert cal.write_slowdown == pytest.approx(2.0)
    # Per cycle: one step inside the write, one half inside (7 writes before the last step);
    # the first step is not a sample.
    assert (cal.writing_samples, cal.idle_samples) == (14, 65)
    assert cal.step_time > 1.0  # the plain mean mixes both
    got = assemble(Inputs(mtbf_per_node=1e6), cal)
    assert got.costs.step_time == pytest.approx(1.0) and got.costs.write_slowdown == pytest.approx(2.0)
    assert got.sources["step_time"].startswith("run: mean of 65 steps with no write running")
    assert "c_w / c_0 = 2.000" in got.sources["write_slowdown"]
    # The model fed with the calibration predicts the simulated job at other intervals.
    for n in (2, 3, 5, 20):
        sim_n = simulate(1.0, 2.0, 0.5, 3.0, n, 12 * n)
        cycle = sim_n["saves"][-3] - sim_n["saves"][-4]
        assert evaluate(n, got.costs).cycle_s == pytest.approx(cycle, rel=1e-6)


def test_calibration_stall_is_not_compute_and_flags_win() -> None:
    """A stall (here with a back-pressure wait inside) is cut out of the step; flags beat the run."""
    sim = simulate(0.05, 0.08, 0.004, 0.25, 5, 60)  # n c_w = 0.4 >= 0.25: hidden
    cal = analyze(sim["events"]).calibration
    assert cal.write_slowdown == pytest.approx(1.6)
    got = assemble(Inputs(mtbf_per_node=1e6, write_slowdown=1.0, step_time=0.06), cal)
    assert (got.costs.step_time, got.costs.write_slowdown) == (0.06, 1.0)
    assert got.sources["write_slowdown"] == "--write-slowdown"


def test_calibration_without_idle_steps_falls_back() -> None:
    cal = analyze(simulate(1.0, 2.0, 0.5, 5.0, 2, 40)["events"]).calibration  # back-pressure: all overlap
    assert cal.idle_samples == 1  # step 2, before the first save: fewer than 3, so no c_0
    assert cal.step_time_idle is None and cal.write_slowdown is None
    got = assemble(Inputs(mtbf_per_node=1e6), cal)
    assert got.costs.write_slowdown == 1.0 and got.costs.step_time == pytest.approx(cal.step_time)
    assert got.sources["write_slowdown"] == "not measured, taken as 1.0 (give --write-slowdown)"
    # No write at all: c_0 is measured, c_w is not, and nothing changes for the model.
    none = analyze(simulate(1.0, 2.0, 0.5, 5.0, 1000, 40)["events"]).calibration
    assert none.step_time_idle == pytest.approx(1.0) and none.write_slowdown is None


def test_slowdown_below_one_is_noise() -> None:
    sim = simulate(1.0, 0.95, 0.5, 3.0, 10, 80)
    cal = analyze(sim["events"]).calibration
    assert cal.write_slowdown == pytest.approx(0.95)
    got = assemble(Inputs(mtbf_per_node=1e6), cal)
    assert got.costs.write_slowdown == 1.0 and "taken as 1.0" in got.sources["write_slowdown"]


def test_calibration_write_is_the_recycled_steady_state() -> None:
    """The first writes of a process allocate new files (slower); once writes recycle a pruned
    checkpoint's files, only those give W. A run without the flag (older events) uses them all."""
    sim = simulate(1.0, 1.0, 0.5, 3.0, 10, 80)
    persists = [e for e in sim["events"] if e["kind"] == "ckpt_persist"]
    for i, e in enumerate(persists):
        e["recycled"] = i >= 2
        if i < 2:
            e["seconds"] = 6.0  # as if fresh files were twice as slow
    assert analyze(sim["events"]).calibration.write == pytest.approx(3.0)
    for e in persists:
        del e["recycled"]
    assert len(persists) == 8 and analyze(sim["events"]).calibration.write == pytest.approx((2 * 6.0 + 6 * 3.0) / 8)
