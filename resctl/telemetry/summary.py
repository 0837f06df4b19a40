"""A one-screen account of why a run failed, from its events."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from resctl.redact import redact_text
from resctl.telemetry.events import ReadStats, read_run

MAX_TRACE_LINES = 8


def failure_summary(run_dir: Path, exit_code: int) -> list[str]:
    """The summary's lines, secret-shaped text masked (events of an older resctl may hold it)."""
    return [redact_text(line) for line in _summary(run_dir, exit_code)]


def _summary(run_dir: Path, exit_code: int) -> list[str]:
    stats = ReadStats()
    faults: list[dict[str, Any]] = []
    cycles = 0
    inprocess: set[tuple[int, int]] = set()  # (cycle, iteration) of each in-process restart
    seen: dict[int, set[int]] = collections.defaultdict(set)  # cycle -> ranks with a record
    said: dict[int, set[int]] = collections.defaultdict(set)  # cycle -> ranks that recorded a fault or an end
    for e in read_run(run_dir, stats) if run_dir.is_dir() else ():
        seen[e["cycle"]].add(e["rank"])
        if e["kind"] == "fault":
            faults.append(e)
            said[e["cycle"]].add(e["rank"])
        elif e["kind"] == "end":
            said[e["cycle"]].add(e["rank"])
        elif e["kind"] == "start":
            cycles = max(cycles, e["cycle"])
        elif e["kind"] == "restart" and e.get("layer") == "inprocess":
            inprocess.add((e["cycle"], e["iteration"]))
    restarts = f"{cycles} launcher restart(s)" + (f" and {len(inprocess)} in-process restart(s)" if inprocess else "")
    lines = [f"resctl: the job failed (exit {exit_code}) after {restarts}; run dir {run_dir}"]
    if stats.damaged:
        lines.append(f"resctl: {stats.damaged} damaged line(s) of the events files skipped, e.g. {stats.examples[0]}")
    silent = sorted(seen[cycles] - said[cycles])
    if silent and faults:
        lines.append(f"resctl: rank {', '.join(map(str, silent))} ended without a record (a signal, the OOM killer or "
                     "a heartbeat timeout): errors of other ranks in a collective followed from it")
    if not faults:
        lines.append("resctl: no worker recorded a Python error: a worker was killed (signal, OOM) or hung "
                     "past its heartbeat timeout; see the launcher log above and " + str(run_dir / "logs"))
        return lines
    by_cause: collections.Counter[tuple[str, str]] = collections.Counter(
        (f["cause"], _first_line(f["error"] or "")) for f in faults
    )
    lines.append("resctl: faults recorded by the workers:")
    for (cause, error), count in by_cause.most_common(5):
        ranks = sorted({f["rank"] for f in faults if f["cause"] == cause and _first_line(f["error"] or "") == error})
        lines.append(f"  {count:>3} x {cause}: {error} (rank {', '.join(map(str, ranks))})")
    last = faults[-1]
    trace = str(last["traceback"] or "").rstrip().splitlines()
    if trace:
        lines.append(f"resctl: last fault, rank {last['rank']} cycle {last['cycle']}:")
        lines.extend("  " + t for t in trace[-MAX_TRACE_LINES:])
    return lines


def _first_line(text: Any) -> str:
    return str(text).strip().splitlines()[0][:160] if str(text).strip() else ""
