"""The interval model against published cases, the AWS back-pressure case, and profile editing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from resctl.tuning.inputs import Inputs, MissingInput, assemble, parse_size
from resctl.tuning.model import Costs, daly_interval, evaluate, recommend, young_interval
from resctl.tuning.profile_edit import ProfileEditError, set_interval, write_interval

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MIN, HOUR = 60.0, 3600.0


def test_daly_published_examples() -> None:
    # Daly (FGCS 2006): delta = 5 min, M = 24 h -> ~117 min; M = 6 h -> ~57 min.
    assert daly_interval(5 * MIN, 24 * HOUR) / MIN == pytest.approx(116.69, abs=0.01)
    assert round(daly_interval(5 * MIN, 24 * HOUR) / MIN) == 117
    assert daly_interval(5 * MIN, 6 * HOUR) / MIN == pytest.approx(56.71, abs=0.01)
    assert round(daly_interval(5 * MIN, 6 * HOUR) / MIN) == 57
    # Young's first-order term for the same case, and Daly's cap when the dump outlasts 2M.
    assert young_interval(5 * MIN, 24 * HOUR) / MIN == pytest.approx(120.0)
    assert daly_interval(3 * HOUR, 1 * HOUR) == 1 * HOUR


def test_aws_back_pressure_case_async_cannot_hide_the_write() -> None:
    # AWS, 16 H100: 100 steps ~ 280 s of compute, a ~275 s write; async measured 29.6 %.
    costs = Costs(step_time=2.8, stall=1.0, write=275.0, restart=17.0, mtbf=24 * HOUR / 2)
    rec = recommend(costs, current=100)
    assert rec.current is not None and rec.current.regime == "no-headroom"
    assert rec.warnings and "async cannot hide" in rec.warnings[0]
    # The recommendation keeps 1.2 x 275 s = 330 s of compute between saves: 118 steps.
    assert rec.bound == "back-pressure"
    assert rec.interval_steps == 118
    assert rec.prediction.regime == "ok"
    # A little shorter and every save waits for the last write: efficiency is tau / (W + s).
    inside = evaluate(50, costs)
    assert inside.regime == "back-pressure"
    assert inside.wait_s == pytest.approx(275.0 - 140.0)
    assert inside.efficiency == pytest.approx(140.0 / 276.0)
    # At 1000 steps AWS measured 99.2-99.8 %; the model says 99.96 % (stall only).
    assert evaluate(1000, costs).efficiency == pytest.approx(2800 / 2801)
    # Sync at 100 steps blocks for the whole write: about half the time.
    assert evaluate(100, costs, "sync").efficiency == pytest.approx(280.0 / 556.0)


def test_steps_lost_per_failure_closed_forms() -> None:
    c = Costs(step_time=1.0, stall=0.5, write=2.0, restart=3.0, mtbf=1000.0)
    a = evaluate(10, c, "async")  # tau 10, P 10.5: n (s + tau/2 + W) / P
    assert a.cycle_s == 10.5
    assert a.steps_lost == pytest.approx(10 * (0.5 + 5 + 2) / 10.5)
    assert a.wasted_per_failure_s == pytest.approx(3.0 + 7.5)
    assert a.goodput == pytest.approx(10 / 10.5 * (1 - 10.5 / 1000))
    s = evaluate(10, c, "sync")  # delta 2.5, P 12.5: n (delta + tau/2) / P
    assert s.steps_lost == pytest.approx(10 * (2.5 + 5) / 12.5)
    b = evaluate(1, c, "async")  # back-pressure: tau 1 < W 2, w 1, P 2.5
    assert b.cycle_s == 2.5 and b.wait_s == 1.0
    assert b.steps_lost == pytest.approx((2 * 1.0 + 0.5 + 0.5 + 1.0) / 2.5)


def test_daly_bound_and_integer_rounding() -> None:
    # Blocking 5 min, compute 1 min per step, M 24 h: Daly 116.7 min -> 117 steps (or 116).
    c = Costs(step_time=MIN, stall=5 * MIN, write=0.0, mtbf=24 * HOUR)
    rec = recommend(c, mode="async")
    assert rec.bound == "daly"
    assert rec.interval_steps in (116, 117)
    sync = recommend(Costs(step_time=MIN, stall=0.0, write=5 * MIN, mtbf=24 * HOUR), mode="sync")
    assert sync.interval_steps in (116, 117)


def test_recommendation_beats_neighbours() -> None:
    c = Costs(step_time=0.5, stall=2.0, write=30.0, restart=60.0, mtbf=6 * HOUR)
    rec = recommend(c, current=20)
    n = rec.interval_steps
    best = rec.prediction.goodput
    for other in (n // 2, n * 2):
        assert evaluate(other, c).goodput < best
    assert {a.label for a in rec.alternatives} >= {"recommended", "best sync", "current", "current sync"}
    assert rec.warnings and "back-pressure" in rec.warnings[0]  # 20 x 0.5 s = 10 s < 30 s write


def test_bad_costs_are_refused() -> None:
    with pytest.raises(ValueError):
        Costs(step_time=0.0, stall=1.0, write=1.0)
    with pytest.raises(ValueError):
        Costs(step_time=1.0, stall=-1.0, write=1.0)
    with pytest.raises(ValueError):
        recommend(Costs(step_time=1.0, stall=1.0, write=1.0))  # no MTBF: no optimum
    with pytest.raises(ValueError):
        evaluate(0, Costs(step_time=1.0, stall=1.0, write=1.0))


def test_sizes_and_assembly() -> None:
    assert parse_size("6.44GB") == pytest.approx(6.44e9)
    assert parse_size("2GiB") == 2 * 2**30
    assert parse_size("1.3GB/s") == pytest.approx(1.3e9)
    with pytest.raises(ValueError):
        parse_size("fast")
    got = assemble(Inputs(step_time=0.094, stall=0.14, state_size=6.44e9, write_bw=0.61e9, mtbf_per_node=24 * HOUR,
                          nodes=8, interval=50), None)
    assert got.costs.write == pytest.approx(6.44 / 0.61)
    assert got.costs.mtbf == 3 * HOUR
    assert got.sources["restart"].startswith("not measured")
    with pytest.raises(MissingInput, match="--mtbf"):
        assemble(Inputs(step_time=1.0, stall=1.0, write_time=1.0), None)
    with pytest.raises(MissingInput, match="--write-bw"):
        assemble(Inputs(step_time=1.0, stall=1.0, state_size=1e9, mtbf_per_node=HOUR), None)


PROFILE = """# production
[launch]
nproc_per_node = 8   # one per GPU

[checkpoint]
dir = "/fsx/ckpt"
interval_steps   =  100  # tuned by hand
async = true

[heartbeat]
timeout = "15m"
"""


def test_set_interval_edits_only_that_value() -> None:
    out = set_interval(PROFILE, 118)
    assert out == PROFILE.replace("interval_steps   =  100  # tuned by hand", "interval_steps   =  118  # tuned by hand")
    assert tomllib.loads(out)["checkpoint"]["interval_steps"] == 118


def test_set_interval_adds_key_or_section() -> None:
    no_key = PROFILE.replace("interval_steps   =  100  # tuned by hand\n", "")
    out = set_interval(no_key, 7)
    assert tomllib.loads(out)["checkpoint"] == {"dir": "/fsx/ckpt", "interval_steps": 7, "async": True}
    assert out.replace("interval_steps = 7\n", "") == no_key
    bare = "[launch]\nnnodes = 2"
    out = set_interval(bare, 9)
    assert out == "[launch]\nnnodes = 2\n\n[checkpoint]\ninterval_steps = 9\n"
    assert set_interval("", 3) == "[checkpoint]\ninterval_steps = 3\n"


def test_set_interval_refuses_forms_it_cannot_edit() -> None:
    with pytest.raises(ProfileEditError, match="by hand"):
        set_interval('checkpoint = { interval_steps = 5 }\n', 10)
    with pytest.raises(ProfileEditError, match="not valid TOML"):
        set_interval("[checkpoint\n", 10)


def test_write_interval_file(tmp_path: Path) -> None:
    path = tmp_path / "prod.toml"
    path.write_text(PROFILE)
    assert write_interval(path, 250) is True
    assert tomllib.loads(path.read_text())["checkpoint"]["interval_steps"] == 250
    assert write_interval(path, 250) is False
    assert [p.name for p in tmp_path.iterdir()] == ["prod.toml"]
