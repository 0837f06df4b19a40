"""The event schema (one definition of every kind) and the readers' handling of damaged lines."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resctl.telemetry import events as ev
from resctl.telemetry import metrics

REPO = Path(__file__).resolve().parents[2]


def record(kind: str, t: float, rank: int = 0, **fields: object) -> str:
    return json.dumps({"t": t, "kind": kind, "rank": rank, "cycle": 0, "iteration": 0, **fields})


def test_every_kind_the_code_emits_is_defined() -> None:
    emitted = set()
    for path in (REPO / "resctl").rglob("*.py"):
        emitted |= set(re.findall(r"""\.emit\(\s*["'](\w+)["']""", path.read_text(encoding="utf-8")))
    assert emitted, "no emit() calls found"
    assert emitted <= set(ev.KINDS), emitted - set(ev.KINDS)
    assert len(ev.KINDS) >= 11  # the 10 kinds of 2026-11 plus `snapshot`


def test_docs_are_rendered_from_the_schema() -> None:
    doc = (REPO / "docs" / "events.md").read_text(encoding="utf-8")
    assert doc == ev.render_markdown(), "run: python -c 'from resctl.telemetry.events import render_markdown as r; " \
                                        "open(\"docs/events.md\", \"w\").write(r())'"


def test_emit_refuses_what_the_schema_does_not_define(tmp_path: Path) -> None:
    log = ev.EventLog(tmp_path, rank=0)
    with pytest.raises(ValueError, match="unknown event kind"):
        log.emit("stepp", step=1, duration=1.0)
    with pytest.raises(ValueError, match="needs duration"):
        log.emit("step", step=1)
    log.emit("step", step=1, duration=0.5)
    log.close()
    (got,) = ev.read_run(tmp_path)
    assert (got["kind"], got["step"], got["duration"], got["cycle"]) == ("step", 1, 0.5, 0)


def test_optional_fields_read_as_none_and_types_are_checked() -> None:
    e = ev.validate({"t": 1, "kind": "ckpt_persist", "rank": 0, "step": None, "seconds": 2})
    assert e is not None and e["step"] is None and e["seconds"] == 2.0 and e["bytes"] is None
    assert e["cycle"] == 0 and e["iteration"] == 0
    for bad in ({"t": 1, "kind": "step", "rank": 0, "step": "3", "duration": 1.0},  # a string step
                {"t": 1, "kind": "step", "rank": True, "step": 3, "duration": 1.0},  # bool is not an int
                {"t": float("nan"), "kind": "end", "rank": 0, "status": "ok"},
                {"t": 1, "kind": "nope", "rank": 0}, [1, 2], None, "step"):
        assert ev.validate(bad) is None, bad


def test_damaged_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    lines = [record("start", 1.0).encode(), b"\xff\xfe not utf-8", b"null", b"[" * 100_000 + b"]" * 100_000,
             record("step", 2.0, step="x", duration=1.0).encode(), record("step", 3.0, step=1, duration=1.0).encode(),
             b"", record("end", 4.0, status="ok").encode()]
    (tmp_path / "events-rank0.jsonl").write_bytes(b"\n".join(lines) + b"\n" + b'{"t": 5, "kind": "st')
    stats = ev.ReadStats()
    got = [e["kind"] for e in ev.read_run(tmp_path, stats)]
    assert got == ["start", "step", "end"]
    assert stats.damaged == 5
    assert any("not UTF-8" in x for x in stats.examples) and any("nested too deep" in x for x in stats.examples)


def test_parse_line_never_raises_on_mangled_records() -> None:
    rng = random.Random(14)
    seeds = [record("step", 1.5, step=3, duration=0.25), record("fault", 2.0, cause="exception", error="x"),
             record("ckpt_persist", 3.0, step=None, seconds=1.0, bytes=10, path="/p")]
    for i in range(600):
        line = bytearray(rng.choice(seeds).encode())
        for _ in range(rng.randint(1, 4)):
            op, pos = rng.randint(0, 2), rng.randrange(len(line))
            if op == 0:
                line[pos] = rng.randrange(256)
            elif op == 1:
                del line[pos:pos + rng.randint(1, 8)]
            else:
                line[pos:pos] = rng.choice([b"null", b"[[[[", b"\x80", b"1e999", b'"', b"{}"])
        event, why = ev.parse_line(bytes(line))
        assert (event is None) == bool(why), (i, line)
        if event is not None:
            assert event["kind"] in ev.KINDS and isinstance(event["t"], float)


def run_with_damage(run: Path) -> None:
    run.mkdir()
    out = [record("start", 1000.0)]
    for step in range(1, 31):
        out.append(record("step", 1000.0 + step, step=step, duration=1.0))
        if step == 10:
            out.append("null")
            out.append("\udcff")  # written below as a raw non-UTF-8 byte
    text = "\n".join(out) + "\n"
    (run / "events-rank0.jsonl").write_bytes(text.encode("utf-8", "surrogateescape"))


def test_report_counts_damaged_lines_and_reads_the_rest(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_with_damage(run)
    proc = subprocess.run([sys.executable, "-m", "resctl", "report", str(run), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["damaged_lines"] == 2 and doc["final_step"] == 30 and doc["kept_steps"] == 30
    proc = subprocess.run([sys.executable, "-m", "resctl", "report", str(run)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "2 damaged line(s) skipped" in proc.stdout, proc.stdout + proc.stderr


def test_a_bad_line_does_not_drop_the_rest_of_a_metrics_batch(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run_with_damage(run)
    collector = metrics.RunCollector(run)
    collector.update()
    families = {f.name: f.samples[0].value for f in collector.collect() if f.samples}
    assert families["resctl_steps"] == 30
    assert families["resctl_event_lines_damaged"] == 2


def _read(path: Path) -> list[dict]:
    stats = ev.ReadStats()
    out = list(ev.read_file(path, stats))
    assert stats.damaged == 0, stats.examples
    return out


def test_batched_step_events_are_valid_in_order_and_complete_at_close(tmp_path: Path) -> None:
    log = ev.EventLog(tmp_path, rank=3, cycle=2)
    log.emit("start", pid=1)
    for n in range(1, 6):
        log.step(n, 0.25 * n)
    assert [e["kind"] for e in _read(ev.events_path(tmp_path, 3))] == ["start"], "steps wait for their batch"
    log.iteration = 1
    log.emit("restart", layer="inprocess")  # any other event writes the batch first: the file stays in order
    log.step(6, 1e-7)
    log.close()
    got = _read(ev.events_path(tmp_path, 3))
    assert [e["kind"] for e in got] == ["start"] + ["step"] * 5 + ["restart", "step"]
    steps = [e for e in got if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    assert [e["duration"] for e in steps] == [0.25, 0.5, 0.75, 1.0, 1.25, 0.0]
    assert [e["iteration"] for e in steps] == [0] * 5 + [1], "a step keeps the iteration it was made in"
    assert all(e["rank"] == 3 and e["cycle"] == 2 for e in got)
    assert [e["t"] for e in got] == sorted(e["t"] for e in got)


def test_a_step_batch_is_written_after_flush_every_or_batch_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    # The log's clock, held still: a loaded box that stalls the loop for 0.2 s must not flush early here.
    now = [1_000_000.0]
    monkeypatch.setattr(ev, "time", SimpleNamespace(time=lambda: now[0]))
    monkeypatch.setattr(ev, "STEP_BATCH", 4)
    monkeypatch.setattr(ev, "STEP_FLUSH_EVERY", 0.2)
    log = ev.EventLog(tmp_path, rank=0)
    for n in range(1, 10):
        log.step(n, 0.001)
    assert [e["step"] for e in _read(ev.events_path(tmp_path, 0))] == [1, 2, 3, 4, 5, 6, 7, 8]
    now[0] += 0.19
    log.step(10, 0.001)  # not yet due: 0.19 s after step 9
    assert [e["step"] for e in _read(ev.events_path(tmp_path, 0))][-1] == 8
    now[0] += 0.02
    log.step(11, 0.001)  # the batch of steps 9 and 10 is overdue now
    assert [e["step"] for e in _read(ev.events_path(tmp_path, 0))][-3:] == [9, 10, 11]
    log.close()


KILLED_WRITER = """
import sys, time
from resctl.telemetry.events import EventLog
log = EventLog(sys.argv[1], rank=0)
n = 0
t_end = time.monotonic() + 2.5
while time.monotonic() < t_end:
    n += 1
    log.step(n, 0.001)
    time.sleep(0.001)
print(n, flush=True)
time.sleep(60)
"""


def test_a_sigkill_loses_at_most_the_last_batch_of_steps(tmp_path: Path) -> None:
    import os
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    made = int(proc.stdout.readline())
    killed_at = time.time()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    steps = _read(ev.events_path(tmp_path, 0))
    assert [e["step"] for e in steps] == list(range(1, len(steps) + 1)), "no gap, no torn line"
    assert len(steps) < made, "the last batch was still in memory"
    assert killed_at - steps[-1]["t"] <= ev.STEP_FLUSH_EVERY + 1.0, "what was lost is at most one batch"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1e6, allow_nan=False), st.one_of(st.none(), st.floats(0, 1e6, allow_nan=False))),
                min_size=1, max_size=20))
def test_step_lines_carry_six_decimals_as_round_gave(tmp_path_factory: pytest.TempPathFactory,
                                                     values: list[tuple[float, float | None]]) -> None:
    """The step batch formats its numbers itself (no `round()` on the hot path): what a reader parses is still the
    value rounded to six decimals, and every line is valid JSON of the `step` kind."""
    run = tmp_path_factory.mktemp("steps")
    log = ev.EventLog(run, rank=0)
    for n, (duration, busy) in enumerate(values, 1):
        log.step(n, duration, busy)
    log.close()
    lines = [json.loads(line) for line in ev.events_path(run, 0).read_text().splitlines()]
    assert [(e["duration"], e.get("busy")) for e in lines] == \
        [(round(d, 6), None if b is None else round(b, 6)) for d, b in values]
