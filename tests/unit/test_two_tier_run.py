"""A run with the memory tier: its calibration, `resctl report` and metrics (which tier each
recovery used, the rollback), and `resctl tune-interval` planning two tiers from it."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from resctl.telemetry import metrics
from resctl.telemetry.events import read_events
from resctl.telemetry.goodput import analyze
from resctl.tuning.model import Costs
from resctl.tuning.two_tier import MemoryCosts, plan

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T0 = 1_800_000_000.0
STEP, MEM_STALL, COMMIT, DISK_STALL, WRITE = 1.0, 0.25, 0.5, 0.25, 2.0


def resctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # rich tables unwrapped
    return subprocess.run([sys.executable, "-m", "resctl", *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env=env)


def write_run(run_dir: Path, plan_json: bool = True) -> None:
    """One rank; 1 s of compute a step; a memory snapshot every 2 steps (blocks 0.25 s, commits in
    0.5 s) and a disk checkpoint every 10 (written from the snapshot: 0.25 s stall, 2 s write).
    Cycle 0 runs 1-27 and is killed (no record); cycle 1 restores step 26 from memory and runs
    27-40, then an exception; cycle 2 restores step 30 from disk and runs 31-45."""
    rows: list[dict[str, Any]] = []

    def emit(t: float, kind: str, cycle: int, **fields: Any) -> None:
        rows.append({"t": T0 + t, "kind": kind, "rank": 0, "cycle": cycle, "iteration": 0, **fields})

    t = 0.0
    for cycle, (first, last, tier, resumed) in enumerate([(1, 27, None, 0), (27, 40, "memory", 26), (31, 45, "disk", 30)]):
        emit(t, "start", cycle)
        if tier:
            emit(t + 0.1, "ckpt_load", cycle, step=resumed, tier=tier, seconds=0.1)
            emit(t + 0.2, "resume", cycle, step=resumed)
        t += 0.5
        extra = 0.0
        for k in range(first, last + 1):
            t += (STEP + extra) if k != first else 1.0
            emit(t, "step", cycle, step=k, duration=(STEP + extra) if k != first else 1.0)
            extra = 0.0
            if k % 2 == 0 and k != last:
                emit(t + MEM_STALL + COMMIT, "ckpt_mem", cycle, step=k, seconds=MEM_STALL, waited=0.0, commit=COMMIT,
                     bytes=4096)
                extra += MEM_STALL
            if k % 10 == 0 and k != last:
                emit(t + extra + DISK_STALL, "ckpt_stall", cycle, step=k, seconds=DISK_STALL, waited=0.0)
                emit(t + extra + DISK_STALL + WRITE, "ckpt_persist", cycle, step=k, seconds=WRITE, bytes=4096)
                extra += DISK_STALL
        if cycle == 1:
            emit(t + 0.1, "fault", cycle, cause="exception", error="boom", step=last)
        t += 3.0
    rows.sort(key=lambda r: r["t"])
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "events-rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if plan_json:
        (run_dir / "plan.json").write_text(json.dumps(
            {"profile": {"checkpoint": {"interval_steps": 10, "memory_every": 2, "async": True}}}))


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    write_run(tmp_path / "run")
    return tmp_path / "run"


def test_calibration_reads_the_memory_tier(run: Path) -> None:
    a = analyze(read_events(run), json.loads((run / "plan.json").read_text()))
    cal = a.calibration
    assert cal.step_time == pytest.approx(STEP)  # snapshot stalls are taken out of the step compute
    assert cal.mem_stall == pytest.approx(MEM_STALL) and cal.mem_commit == pytest.approx(COMMIT)
    assert cal.mem_waited == 0.0 and cal.mem_bytes == 4096 and cal.memory_every == 2
    assert cal.stall == pytest.approx(DISK_STALL) and cal.write == pytest.approx(WRITE)
    assert [(r.tier, r.last_step, r.resumed_step, r.rollback_steps) for r in a.recoveries] == [
        ("memory", 27, 26, 1), (None, 40, 30, 10)][:1] + [("disk", 40, 30, 10)]
    no_plan = analyze(read_events(run))
    assert no_plan.calibration.memory_every == 2  # the most common gap between snapshots


def test_report_shows_the_tier_and_rollback_of_each_recovery_and_int_cycles(run: Path, tmp_path: Path) -> None:
    proc = resctl("report", str(run), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "27->26 (memory)" in proc.stdout and "40->30 (disk)" in proc.stdout
    assert "26 (reference rank); stall 0.25 s, wait 0 s, commit 0.5 s mean; every 2 steps" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if "ckpt_load" in line]
    assert len(rows) == 2 and "tier=memory" in rows[0] and "tier=disk" in rows[1]
    cells = [c.strip() for c in rows[0].split("│") if c.strip()]
    assert cells[2:4] == ["1", "0"], cells  # cycle and iteration: integers, in their own columns
    assert not re.search(r"│\s*\d+\.\d+\s*│\s*ckpt_load", proc.stdout)
    html = tmp_path / "r.html"
    assert resctl("report", str(run), "--html", str(html), cwd=tmp_path).returncode == 0
    page = html.read_text()
    assert "<td>27-&gt;26 (memory)</td><td>1</td>" in page and "<td>40-&gt;30 (disk)</td><td>10</td>" in page
    doc = json.loads(resctl("report", str(run), "--json", cwd=tmp_path).stdout)
    assert [(r["tier"], r["rollback_steps"]) for r in doc["recoveries"]] == [("memory", 1), ("disk", 10)]
    assert all(type(e["cycle"]) is int for e in doc["timeline"])


def test_metrics_show_the_tier_and_rollback(run: Path) -> None:
    collector = metrics.RunCollector(run, None)
    collector.update()
    got = {}
    for family in collector.collect():
        for sample in family.samples:
            got[sample.name + json.dumps(sample.labels, sort_keys=True)] = sample.value
    assert got['resctl_recoveries_by_tier_total{"tier": "memory"}'] == 1
    assert got['resctl_recoveries_by_tier_total{"tier": "disk"}'] == 1
    assert got['resctl_rolled_back_steps_total{"tier": "memory"}'] == 1
    assert got['resctl_rolled_back_steps_total{"tier": "disk"}'] == 10
    assert got['resctl_rollback_steps{"tier": "disk"}'] == 10  # the last recovery
    assert got["resctl_memory_snapshot_stall_seconds{}"] == MEM_STALL


def test_tune_interval_plans_two_tiers_from_the_run(run: Path, tmp_path: Path) -> None:
    profile = tmp_path / "prod.toml"
    profile.write_text("# mine\n[checkpoint]\ninterval_steps = 10 # old\n")
    proc = resctl("tune-interval", "--from-run", str(run), "--mtbf", "6h", "--node-mtbf", "30d", "--nodes", "4",
                  "--json", "--write-profile", str(profile), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    two = doc["two_tier"]
    assert doc["two_tier_skipped"] is None and doc["sources"]["mem_stall"].startswith("run")
    assert doc["sources"]["mem_commit"].startswith("run") and doc["sources"]["memory_every"] == "run"
    mtbf, node = 6 * 3600 / 4, 30 * 86400 / 4
    costs = Costs(**doc["recommendation"]["costs"])
    want = plan(MemoryCosts(MEM_STALL, COMMIT), costs, process_mtbf=1 / (1 / mtbf - 1 / node), node_mtbf=node)
    assert (two["memory_every"], two["interval_steps"]) == (want.memory_every, want.interval_steps)
    assert two["interval_steps"] % two["memory_every"] == 0 and two["overhead"] <= 0.01
    assert two["node_mtbf"] == pytest.approx(node) and "a node lost every 180 h" in doc["mtbf_assumption"]
    assert doc["profile"] == {"interval_steps": two["interval_steps"], "memory_every": two["memory_every"]}
    now = doc["two_tier_current"]  # the run's own memory_every = 2, interval_steps = 10, assessed alike
    assert (now["memory_every"], now["interval_steps"], now["memory_rule"]) == (2, 10, "given")
    assert now["steps_lost_process"] == pytest.approx(1 + COMMIT / STEP) and now["overhead"] > two["overhead"]
    written = tomllib.loads(profile.read_text())["checkpoint"]
    assert written == doc["profile"] and profile.read_text().startswith("# mine\n")

    text = resctl("tune-interval", "--from-run", str(run), "--mtbf", "6h", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "recommended (two tiers)" in text.stdout and "checkpoint.memory_every" in text.stdout
    assert "MTBF assumed: any fault" in text.stdout and "work lost per process fault" in text.stdout
    assert "current (memory_every = 2, interval_steps = 10): overhead" in text.stdout
    odd = resctl("tune-interval", "--from-run", str(run), "--mtbf", "6h", "--memory-every", "3", cwd=tmp_path)
    assert "interval_steps 10 is not a multiple of memory_every 3" in odd.stdout
    toml = resctl("tune-interval", "--from-run", str(run), "--mtbf", "6h", "--toml", cwd=tmp_path)
    assert toml.returncode == 0, toml.stderr
    section = tomllib.loads(toml.stdout)["checkpoint"]
    assert set(section) == {"interval_steps", "memory_every"} and section["interval_steps"] % section["memory_every"] == 0


def test_no_memory_tier_events_plans_the_disk_only_and_says_why(tmp_path: Path) -> None:
    faults = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "faults"
    proc = resctl("tune-interval", "--from-run", str(faults), "--mtbf", "24h", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["two_tier"] is None and "no memory-tier snapshots" in doc["two_tier_skipped"]
    assert doc["profile"] == {"interval_steps": doc["recommendation"]["interval_steps"]}
    text = resctl("tune-interval", "--from-run", str(faults), "--mtbf", "24h", cwd=tmp_path)
    assert "memory tier not planned" in text.stderr and "memory_every = 1" in text.stderr
    toml = resctl("tune-interval", "--step-time", "1s", "--stall", "1s", "--write-time", "5s", "--mtbf", "1h",
                  "--toml", cwd=tmp_path)
    assert toml.returncode == 0 and tomllib.loads(toml.stdout)["checkpoint"].keys() == {"interval_steps"}
    assert "disk checkpoints only" in toml.stdout


def test_a_copy_longer_than_a_step_snapshots_every_few_steps(tmp_path: Path) -> None:
    """Device staging: the loop hardly waits (stall ~0), the background copy and checksum take 1.5
    steps; the compute between a snapshot and the step ending in the next one must be >= 1.2x that
    (issue 15's GPU efficiency rule; issue 31: that step waits for a commit still in flight)."""
    proc = resctl("tune-interval", "--step-time", "80ms", "--stall", "5ms", "--write-time", "4s", "--mtbf", "24h",
                  "--mem-stall", "0s", "--mem-commit", "120ms", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    two = json.loads(proc.stdout)["two_tier"]
    # At 2 (2 x 80 ms >= 1.2 x 120 ms, the floor) the step ending in the next snapshot would wait 40 ms:
    # over budget, so the plan looks further, where (m - 1) x 80 ms covers the commit.
    assert two["memory_every"] >= 3 and two["memory_rule"] == "budget" and two["overhead"] <= 0.01


BASE = ["--step-time", "1s", "--stall", "0.1s", "--write-time", "5s", "--mtbf", "24h"]


@pytest.mark.parametrize("args, message", [
    (["--mem-stall", "-1s", "--mem-commit", "1s"], "--mem-stall"),
    (["--mem-stall", "nan", "--mem-commit", "1s"], "--mem-stall"),
    (["--mem-stall", "inf", "--mem-commit", "1s"], "--mem-stall"),
    (["--mem-stall", "0.1s", "--mem-commit", "-2"], "--mem-commit"),
    (["--mem-stall", "0.1s"], "--mem-commit"),
    (["--mem-stall", "0.1s", "--mem-commit", "0.1s", "--node-mtbf", "0"], "--node-mtbf must be > 0"),
    (["--mem-stall", "0.1s", "--mem-commit", "0.1s", "--node-mtbf", "1h"], "give a --node-mtbf at least --mtbf"),
    (["--mem-stall", "0.1s", "--mem-commit", "0.1s", "--max-overhead", "0"], "--max-overhead"),
    (["--mem-stall", "0.1s", "--mem-commit", "0.1s", "--max-overhead", "150%"], "--max-overhead"),
    (["--mem-stall", "0.1s", "--mem-commit", "0.1s", "--max-overhead", "nan"], "--max-overhead"),
    (["--mem-stall", "0.1s", "--mem-commit", "0.1s", "--json", "--toml"], "--toml"),
    (["--mem-stall", "0.1s", "--mem-commit", "0.1s", "--memory-every", "0"], "--memory-every"),
])
def test_bad_two_tier_input_exits_2_naming_the_key(tmp_path: Path, args: list[str], message: str) -> None:
    proc = resctl("tune-interval", *BASE, *args, cwd=tmp_path)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_a_hostile_run_with_negative_commits_exits_2(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_run(run)
    events = run / "events-rank0.jsonl"
    events.write_text(events.read_text().replace('"commit": 0.5', '"commit": -7.0'))
    proc = resctl("tune-interval", "--from-run", str(run), "--mtbf", "6h", cwd=tmp_path)
    assert proc.returncode == 2 and "mem_commit" in proc.stderr and "--mem-commit" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert math.isfinite(analyze(read_events(run)).calibration.step_time)
