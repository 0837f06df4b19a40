"""Goodput, recovery and calibration on crafted event logs (tests/fixtures/runs/make_runs.py),
and the report / tune-interval commands on them (real subprocesses, as a user runs them)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from resctl.telemetry.events import read_events
from resctl.telemetry.goodput import analyze, percentile

RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "runs"
FAULTS = RUNS / "faults"


def resctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resctl", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def faults() -> object:
    return analyze(read_events(FAULTS), json.loads((FAULTS / "plan.json").read_text()))


def test_goodput(faults: object) -> None:
    a = faults
    assert a.wall_s == 69.0  # type: ignore[attr-defined]
    # Kept: steps 1-20 of cycle 0, 21-30 of cycle 1, 31-45 of its in-process iteration 1, 1 s each.
    assert a.kept_steps == 45 and a.steps_run == 55 and a.productive_s == 45.0  # type: ignore[attr-defined]
    assert a.training_goodput == pytest.approx(45 / 69)  # type: ignore[attr-defined]
    # Up: cycle 0 from the last start (0.5) to its last event (29.0); cycle 1 from 31.5 to 69.0.
    assert a.up_s == 66.0 and a.infrastructure_goodput == pytest.approx(66 / 69)  # type: ignore[attr-defined]


def test_recoveries(faults: object) -> None:
    first, second = faults.recoveries  # type: ignore[attr-defined]
    assert (first.layer, first.cause, first.rank, first.injected) == ("launcher", "sigkill", 1, True)
    assert (first.t_fault, first.detection, first.restart, first.load, first.first_step, first.total) == \
        (27.0, 2.0, 2.5, 2.0, 1.5, 8.0)
    assert (first.last_step, first.resumed_step, first.rollback_steps) == (25, 20, 5)
    assert (second.layer, second.cause, second.rank, second.injected) == ("inprocess", "exception", 0, False)
    assert (second.t_fault, second.detection, second.restart, second.load, second.first_step, second.total) == \
        (50.0, 2.0, 0.5, 1.0, 0.5, 4.0)
    assert second.rollback_steps == 5
    stats = faults.recovery_stats["total"]  # type: ignore[attr-defined]
    assert (stats["p50"], stats["p95"], stats["max"]) == (6.0, pytest.approx(7.8), 8.0)
    assert faults.causes == {"launcher: sigkill": 1, "inprocess: exception": 1}  # type: ignore[attr-defined]


def test_freshness_and_calibration(faults: object) -> None:
    f = faults.freshness  # type: ignore[attr-defined]
    assert f["max_age_steps"] == 11.0
    # Step 31 of cycle 1 (t 45.5): the newest durable checkpoint is step 20, persisted at 23.75.
    assert f["max_age_s"] == 21.75
    assert faults.checkpoints == 4  # type: ignore[attr-defined]
    c = faults.calibration  # type: ignore[attr-defined]
    assert (c.step_time, c.step_samples, c.stall, c.write, c.saves) == (1.0, 52, 0.5, 1.75, 4)
    assert (c.interval_steps, c.async_, c.restart, c.unplanned_faults) == (10, True, 6.0, 1)


def test_interval_inferred_without_plan() -> None:
    a = analyze(read_events(RUNS / "aws"))
    assert a.calibration.interval_steps == 100
    assert a.calibration.step_time == pytest.approx(2.8)
    assert a.calibration.write == 275.0 and a.calibration.stall == 1.0
    assert a.recoveries == [] and a.kept_steps == 300


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 95) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_report_json_and_html(tmp_path: Path) -> None:
    html = tmp_path / "r.html"
    proc = resctl("report", str(FAULTS), "--json", "--html", str(html), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["training_goodput"] == pytest.approx(45 / 69)
    assert [r["total"] for r in doc["recoveries"]] == [8.0, 4.0]
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "Plotly.newPlot" in page  # the figures, drawn by plotly.js
    assert "plotly.js v" in page  # inlined: viewable without a server or network
    for trace in ("step (kept)", "step (rolled back)", "checkpoint durable", "fault (* drill)", "training goodput"):
        assert f'"name":"{trace}"' in page, trace
    assert "recovery time per fault" in page


def test_report_terminal(tmp_path: Path) -> None:
    proc = resctl("report", str(FAULTS), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "65.22%" in proc.stdout and "95.65%" in proc.stdout and "25->20" in proc.stdout


@pytest.mark.parametrize("setup, message", [
    ("missing", "no such run directory"),
    ("empty", "no events-rank"),
    ("garbage", "no events"),
])
def test_report_bad_input(tmp_path: Path, setup: str, message: str) -> None:
    run = tmp_path / "run"
    if setup != "missing":
        run.mkdir()
    if setup == "garbage":
        (run / "events-rank0.jsonl").write_text("not json\n")
    proc = resctl("report", str(run), cwd=tmp_path)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_tune_interval_from_run_writes_profile(tmp_path: Path) -> None:
    profile = tmp_path / "prod.toml"
    profile.write_text("# mine\n[checkpoint]\ninterval_steps = 100 # hand-picked\nasync = true\n")
    proc = resctl("tune-interval", "--from-run", str(RUNS / "aws"), "--mtbf", "24h", "--nodes", "2",
                  "--json", "--write-profile", str(profile), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    rec = doc["recommendation"]
    assert rec["interval_steps"] == 118 and rec["bound"] == "back-pressure"
    assert rec["current"]["interval_steps"] == 100 and rec["current"]["regime"] == "no-headroom"
    assert doc["sources"]["step_time"].startswith("run")
    assert "async cannot hide" in proc.stderr
    assert profile.read_text() == "# mine\n[checkpoint]\ninterval_steps = 118 # hand-picked\nasync = true\n"


def test_tune_interval_explicit_numbers(tmp_path: Path) -> None:
    proc = resctl("tune-interval", "--step-time", "1m", "--stall", "5m", "--write-time", "0", "--mtbf", "24h", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "checkpoint.interval_steps = 117" in proc.stdout or "checkpoint.interval_steps = 116" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--step-time", "1s", "--stall", "1s", "--write-time", "5s"], "--mtbf"),
    (["--step-time", "soon", "--mtbf", "1h"], "--step-time"),
    (["--step-time", "1s", "--stall", "1s", "--state-size", "1GB", "--mtbf", "1h"], "--write-bw"),
    (["--from-run", "/nonexistent/run", "--mtbf", "1h"], "no such run directory"),
    (["--step-time", "0", "--stall", "1s", "--write-time", "1s", "--mtbf", "1h"], "--step-time"),
])
def test_tune_interval_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    proc = resctl("tune-interval", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr and "Traceback" not in proc.stderr


def random_run(rng: random.Random) -> tuple[list[dict[str, object]], int, float]:
    """Epochs of one rank with random lengths, resume points and step times; returns the events,
    the kept steps and their compute by brute force (every step compared with every later resume)."""
    events: list[dict[str, object]] = []
    t, step, epochs = 0.0, 0, []
    for cycle in range(rng.randint(1, 6)):
        events.append({"t": t, "kind": "start", "rank": 0, "cycle": cycle, "iteration": 0})
        resume = rng.randint(0, step) if cycle else 0
        events.append({"t": t, "kind": "resume", "rank": 0, "cycle": cycle, "iteration": 0, "step": resume})
        step, rows = resume, []
        for _ in range(rng.randint(0, 300)):
            d = rng.choice([0.5, 1.0, 2.0])
            t += d
            step += 1
            events.append({"t": t, "kind": "step", "rank": 0, "cycle": cycle, "iteration": 0, "step": step,
                           "duration": d})
            rows.append((step, d))
        epochs.append((resume, rows))
        t += 1.0
    kept, compute = 0, 0.0
    samples = [d for _, rows in epochs for d in [d for _, d in rows][1:]]
    mean = sum(samples) / len(samples) if samples else 0.0
    for i, (_, rows) in enumerate(epochs):
        cutoff = min([r for r, _ in epochs[i + 1:]], default=10**9)
        for j, (s, d) in enumerate(rows):
            if s <= cutoff:
                kept += 1
                compute += mean if j == 0 else d
    return events, kept, compute


def test_kept_steps_match_a_brute_force_count() -> None:
    import random

    rng = random.Random(1214)
    for _ in range(200):
        events, kept, compute = random_run(rng)
        a = analyze(events)
        assert a.kept_steps == kept
        assert a.productive_s == pytest.approx(compute)


def test_a_rollback_deep_into_a_long_epoch_is_counted_from_the_bounded_track() -> None:
    """20,000 steps keep at most TRACK_CAP samples; a resume at a step between two samples still
    counts the kept steps exactly and their compute by interpolation."""
    from resctl.telemetry.goodput import TRACK_CAP

    events: list[dict[str, object]] = [{"t": 0.0, "kind": "start", "rank": 0, "cycle": 0, "iteration": 0}]
    t = 0.0
    for step in range(1, 20_001):
        d = 1.0 if step % 2 else 3.0
        t += d
        events.append({"t": t, "kind": "step", "rank": 0, "step": step, "duration": d})
    events += [{"t": t + 5, "kind": "start", "rank": 0, "cycle": 1},
               {"t": t + 6, "kind": "resume", "rank": 0, "cycle": 1, "step": 12_347},
               {"t": t + 7, "kind": "step", "rank": 0, "cycle": 1, "step": 12_348, "duration": 1.0}]
    a = analyze(events)
    assert 20_000 > 2 * TRACK_CAP
    assert a.kept_steps == 12_347 + 1
    exact = sum(1.0 if s % 2 else 3.0 for s in range(2, 12_348)) + 2 * (2 * 10_000 - 1) / 19_999
    assert a.productive_s == pytest.approx(exact, rel=1e-3)
    assert a.recoveries[0].rollback_steps == 20_000 - 12_347


def test_failed_saves_and_skipped_checkpoints_are_counted() -> None:
    from resctl.telemetry.goodput import analyze

    def ev(t: float, kind: str, **kw: object) -> dict[str, object]:
        return {"t": t, "kind": kind, "rank": 0, "cycle": 0, "iteration": 0, **kw}

    events = [ev(1.0, "start"), ev(1.1, "ckpt_skip", step=20, reason="crc mismatch", quarantined="/q"),
              ev(1.2, "resume", step=10), ev(2.0, "step", step=11, duration=0.5),
              ev(2.5, "ckpt_fail", step=11, error="OSError: [Errno 28] No space left on device", consecutive=1, limit=3),
              ev(3.0, "step", step=12, duration=0.5), ev(3.5, "end", status="ok", step=12)]
    a = analyze(events)
    assert (a.failed_saves, a.skipped_checkpoints) == (1, 1)
    assert a.last_save_error is not None and "No space" in a.last_save_error


def test_a_replaced_node_counting_its_cycles_from_zero_joins_the_survivors_next_cycle() -> None:
    """Node b (rank 1) is lost and its pod replaced: its new launcher says cycle 0 again, node a's
    says cycle 1. The recovery is one, from step 16 back to 15, with each rank's tier."""

    def ev(t: float, kind: str, rank: int, cycle: int, **kw: object) -> dict[str, object]:
        return {"t": t, "kind": kind, "rank": rank, "cycle": cycle, "iteration": 0, **kw}

    events = [ev(0.0, "start", 0, 0), ev(0.0, "start", 1, 0), ev(0.5, "resume", 0, 0, step=0),
              ev(0.5, "resume", 1, 0, step=0)]
    for step in range(1, 17):
        events += [ev(0.5 + step * 0.1, "step", r, 0, step=step, duration=0.1) for r in (0, 1)]
    events += [ev(2.5, "fault", 0, 0, step=16, cause="exception"), ev(2.5, "end", 0, 0, step=16, status="error"),
               ev(15.0, "start", 1, 0), ev(16.0, "start", 0, 1), ev(16.0, "restart", 0, 1, layer="launcher"),
               ev(17.0, "ckpt_load", 1, 0, step=15, tier="buddy", seconds=0.1),
               ev(17.0, "ckpt_load", 0, 1, step=15, tier="memory", seconds=0.1),
               ev(17.1, "resume", 1, 0, step=15), ev(17.1, "resume", 0, 1, step=15)]
    events += [ev(17.1 + (s - 15) * 0.1, "step", r, c, step=s, duration=0.1) for s in range(16, 21)
               for r, c in ((0, 1), (1, 0))]
    (rec,) = analyze(events).recoveries
    assert (rec.last_step, rec.resumed_step, rec.rollback_steps, rec.tier) == (16, 15, 1, "buddy+memory")


def test_a_launcher_recovery_splits_into_detect_stop_rendezvous_start_restore_first_step(tmp_path: Path) -> None:
    """Rank 1 SIGKILLed at 10.0 (its last record); the survivor's restart-stop at 10.5 and its last
    record at 10.8; the new workers created at 11.5 / 11.6 (`spawned`) and started at 12.0 / 12.2;
    resumed at 13.0; first steps at 13.5. The report shows each phase, text and --json."""

    def ev(t: float, kind: str, rank: int, cycle: int, **kw: object) -> dict[str, object]:
        return {"t": t, "kind": kind, "rank": rank, "cycle": cycle, "iteration": 0, **kw}

    events = [ev(0.0, "start", r, 0) for r in (0, 1)] + [ev(0.5, "resume", r, 0, step=0) for r in (0, 1)]
    events += [ev(0.5 + s, "step", r, 0, step=s, duration=1.0) for s in range(1, 10) for r in (0, 1)]
    events += [ev(10.0, "step", 1, 0, step=10, duration=0.5), ev(10.5, "end", 0, 0, status="restart-stop", step=9),
               ev(10.8, "ckpt_persist", 0, 0, step=5, seconds=0.1),
               ev(12.0, "start", 0, 1, spawned=11.5), ev(12.2, "start", 1, 1, spawned=11.6),
               ev(13.0, "resume", 0, 1, step=5), ev(13.0, "resume", 1, 1, step=5),
               ev(13.5, "step", 0, 1, step=6, duration=0.5), ev(13.5, "step", 1, 1, step=6, duration=0.5)]
    (rec,) = analyze(events).recoveries
    got = (rec.cause, rec.detection, rec.stop, rec.rendezvous, rec.start_workers, rec.load, rec.first_step)
    assert got == ("killed", 0.5, pytest.approx(0.3), pytest.approx(0.7), pytest.approx(0.7), pytest.approx(0.8), 0.5)
    assert rec.stop + rec.rendezvous + rec.start_workers == pytest.approx(rec.restart)  # type: ignore[operator]
    run = tmp_path / "run"
    run.mkdir()
    for r in (0, 1):
        lines = [json.dumps(e) for e in events if e["rank"] == r]
        (run / f"events-rank{r}.jsonl").write_text("\n".join(lines) + "\n")
    doc = json.loads(resctl("report", str(run), "--json", cwd=tmp_path).stdout)
    stats = doc["recovery_stats"]
    assert [round(stats[k]["p50"], 2) for k in ("detection", "stop", "rendezvous", "start_workers", "load",
                                                "first_step")] == [0.5, 0.3, 0.7, 0.7, 0.8, 0.5]
    text = resctl("report", str(run), cwd=tmp_path).stdout
    assert "rendezvous" in text and "start workers" in text and "restore" in text


def test_the_launchers_clock_times_detection_and_stop() -> None:
    """One rank SIGKILLed after its last step at 10.0 (no survivor to record a stop): the launcher saw the failure
    at 10.4 and had stopped at 10.45 (the new starts' `detected`, `stopped`); created at 10.5, started 11.0. Without
    that clock the whole kill -> creation gap read as rendezvous (0.5 s here, 0.71 s of a 1.0 s recovery on an
    H100); a second node's later `detected`, earlier `stopped` do not move the phases."""

    def ev(t: float, kind: str, rank: int, cycle: int, **kw: object) -> dict[str, object]:
        return {"t": t, "kind": kind, "rank": rank, "cycle": cycle, "iteration": 0, **kw}

    events = [ev(0.0, "start", 0, 0), ev(0.5, "resume", 0, 0, step=0)]
    events += [ev(float(s), "step", 0, 0, step=s, duration=1.0) for s in range(1, 11)]
    events += [ev(11.0, "start", 0, 1, spawned=10.5, detected=10.4, stopped=10.45),
               ev(11.1, "start", 1, 1, spawned=10.6, detected=10.42, stopped=10.43),
               ev(11.5, "resume", 0, 1, step=10), ev(11.5, "resume", 1, 1, step=10),
               ev(12.0, "step", 0, 1, step=11, duration=0.5), ev(12.0, "step", 1, 1, step=11, duration=0.5)]
    (rec,) = analyze(events).recoveries
    got = (rec.detection, rec.stop, rec.rendezvous, rec.start_workers)
    assert got == (pytest.approx(0.4), pytest.approx(0.05), pytest.approx(0.05), pytest.approx(0.6))
    assert rec.stop + rec.rendezvous + rec.start_workers == pytest.approx(rec.restart)  # type: ignore[operator]
    without = [{k: v for k, v in e.items() if k not in ("detected", "stopped")} for e in events]
    (old,) = analyze(without).recoveries
    assert (old.detection, old.stop, old.rendezvous) == (0.0, 0.0, pytest.approx(0.5))


def test_without_spawned_the_rendezvous_runs_to_the_last_start() -> None:
    def ev(t: float, kind: str, cycle: int, **kw: object) -> dict[str, object]:
        return {"t": t, "kind": kind, "rank": 0, "cycle": cycle, "iteration": 0, **kw}

    events = [ev(0.0, "start", 0), ev(1.0, "step", 0, step=1, duration=1.0),
              ev(1.5, "fault", 0, cause="sigkill", injected=True, step=1),
              ev(3.0, "start", 1), ev(3.5, "resume", 1, step=0), ev(4.0, "step", 1, step=1, duration=0.5)]
    (rec,) = analyze(events).recoveries
    assert (rec.stop, rec.rendezvous, rec.start_workers) == (0.0, 1.5, None)
