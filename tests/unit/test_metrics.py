"""Prometheus metrics from a run's events, scraped over loopback from the real HTTP endpoint."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from resctl.telemetry import metrics
from tests.ports import free_port


def write_run(run_dir: Path) -> None:
    """Two ranks; cycle 0 runs steps 1-12 with checkpoints at 5 and 10; rank 1 is SIGKILLed at step 12;
    cycle 1 resumes from 10 and runs to 16."""
    t = 1000.0
    for rank in (0, 1):
        clock = t
        records = [{"t": clock, "kind": "start", "pid": 1, "host": "h", "world_size": 2, "script": "x"}]
        for step in range(1, 13):
            clock += 1.0
            records.append({"t": clock, "kind": "step", "step": step, "duration": 1.0})
            if step in (5, 10):
                records.append({"t": clock + 0.01, "kind": "ckpt_stall", "step": step, "seconds": 0.01, "waited": 0.0})
                records.append({"t": clock + 0.5, "kind": "ckpt_persist", "step": step, "seconds": 0.5, "bytes": 4096})
        if rank == 1:
            records.append({"t": clock + 0.1, "kind": "fault", "cause": "sigkill", "injected": True, "step": 12,
                            "error": "injected sigkill"})
        with open(run_dir / f"events-rank{rank}.jsonl", "w") as fh:
            for r in records:
                fh.write(json.dumps({"rank": rank, "cycle": 0, "iteration": 0, **r}) + "\n")
            clock += 3.0
            fh.write(json.dumps({"t": clock, "kind": "start", "rank": rank, "cycle": 1, "iteration": 0}) + "\n")
            fh.write(json.dumps({"t": clock + 0.15, "kind": "ckpt_load", "rank": rank, "cycle": 1, "iteration": 0,
                                 "step": 10, "tier": "disk", "seconds": 0.1}) + "\n")
            fh.write(json.dumps({"t": clock + 0.2, "kind": "resume", "rank": rank, "cycle": 1, "iteration": 0,
                                 "step": 10}) + "\n")
            for step in range(11, 17):
                clock += 1.0
                fh.write(json.dumps({"t": clock, "kind": "step", "rank": rank, "cycle": 1, "iteration": 0,
                                     "step": step, "duration": 1.0}) + "\n")


def scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in body.splitlines():
        if line.startswith("resctl_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_scraped_values_match_the_events(tmp_path: Path) -> None:
    write_run(tmp_path)
    port = free_port()
    server = metrics.serve(tmp_path, port, addr="127.0.0.1")
    try:
        got = scrape(port)
    finally:
        server.shutdown()
    assert got["resctl_steps_total"] == 18  # rank 0: 12 + 6
    assert got["resctl_checkpoints_total"] == 2
    assert got["resctl_launcher_cycle"] == 1
    assert got["resctl_step_seconds"] == 1.0
    assert got["resctl_checkpoint_persist_seconds"] == 0.5 and got["resctl_checkpoint_bytes"] == 4096
    assert got['resctl_restarts_total{cause="sigkill",layer="launcher"}'] == 1
    assert got['resctl_recoveries_by_tier_total{tier="disk"}'] == 1
    assert got['resctl_rollback_steps{tier="disk"}'] == 2 and got['resctl_rolled_back_steps_total{tier="disk"}'] == 2
    assert 0 < got["resctl_training_goodput_ratio"] < 1
    assert 0 < got["resctl_infrastructure_goodput_ratio"] <= 1
    assert got["resctl_recovery_seconds"] > 0


def test_only_new_lines_are_read_and_torn_lines_wait(tmp_path: Path) -> None:
    log = tmp_path / "events-rank0.jsonl"
    log.write_text(json.dumps({"t": 1, "kind": "start", "rank": 0, "cycle": 0, "iteration": 0}) + "\n")
    collector = metrics.RunCollector(tmp_path, clock=lambda: 100.0)
    collector.update()
    with open(log, "a") as fh:
        fh.write(json.dumps({"t": 2, "kind": "step", "rank": 0, "cycle": 0, "iteration": 0, "step": 1, "duration": 1}) + "\n")
        fh.write('{"t": 3, "kind": "ckpt_persist", "rank": 0')  # a line still being written
    collector.update()
    assert collector.steps == 1 and collector.checkpoints == 0
    with open(log, "a") as fh:
        fh.write(', "cycle": 0, "iteration": 0, "step": 1, "seconds": 0.2, "bytes": 10}\n')
    collector.update()
    families = {f.name: f for f in collector.collect()}
    assert collector.checkpoints == 1
    assert families["resctl_last_checkpoint_age_seconds"].samples[0].value == 97.0


def retained_bytes(steps: int) -> int:
    """Memory the metrics' analysis holds after `steps` steps of 2 ranks with a checkpoint every 100."""
    import gc
    import tracemalloc

    from resctl.telemetry.goodput import Analyzer

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    a = Analyzer(calibrate=False, history=False)
    for rank in (0, 1):
        a.feed({"t": 0.0 + rank, "kind": "start", "rank": rank, "cycle": 0, "iteration": 0})
    for step in range(1, steps + 1):
        for rank in (0, 1):
            a.feed({"t": float(step), "kind": "step", "rank": rank, "cycle": 0, "iteration": 0, "step": step,
                    "duration": 1.0})
        if step % 100 == 0:
            a.feed({"t": step + 0.5, "kind": "ckpt_persist", "rank": 0, "cycle": 0, "iteration": 0, "step": None,
                    "seconds": 0.5, "bytes": 1, "recycled": None, "path": None})
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert a.result(series=False).kept_steps == steps
    return held


def test_the_metrics_analysis_does_not_grow_with_the_steps() -> None:
    small, large = retained_bytes(5_000), retained_bytes(50_000)
    assert large - small < 64 * 1024, (small, large)
