"""The no-progress stop, in the launcher: before each new cycle's workers start, did the last one progress?

resctl's adapters call `before_cycle()` at the top of the launcher's `_start_workers` (the first cycle
and every restart), where NVRx >= 0.6 makes the same decision; so the stop spends no further restart
and needs no worker's help. It reads only what the workers appended to the run directory's events
files since the previous call, and of that only the last `SCAN_BYTES` of each file (steps only grow
within a cycle, so the highest one is at the end): a restart after a day of steps reads a few
milliseconds' worth. When `health.no_progress_cycles` cycles in a row made no progress, it writes the
reason to fatal.json and stops its own launcher with SIGTERM before any worker starts; `resctl run`
prints the reason and exits 93 (`resctl.errors.EXIT_NO_PROGRESS`).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from resctl.health.progress import NoProgress, ProgressTracker
from resctl.telemetry.events import parse_line, rank_files

SCAN_BYTES = 1 << 20


class Gate:
    def __init__(self, run_dir: Path, limit: int) -> None:
        self.run_dir = run_dir
        self.tracker = ProgressTracker(limit)
        self._sizes: dict[Path, int] = {}
        self._started = False

    def before_cycle(self) -> NoProgress | None:
        """Called before each cycle's workers start; the verdict once the limit is reached."""
        reached, resumed = self._scan()
        if not self._started:  # the first cycle: what is there is an earlier run's (a requeue)
            self._started = True
            return None
        return self.tracker.cycle_ended(reached, resumed)

    def _scan(self) -> tuple[int | None, int | None]:
        reached: int | None = None
        resumed: int | None = None
        for path in rank_files(self.run_dir).values():
            start = self._sizes.get(path, 0)
            try:
                size = path.stat().st_size
                with open(path, "rb") as fh:
                    begin = max(start, size - SCAN_BYTES)
                    fh.seek(begin)
                    data = fh.read(size - begin)
            except OSError:
                continue
            self._sizes[path] = size
            if not self._started:
                continue
            lines = data.split(b"\n")
            if begin > start:
                lines = lines[1:]  # cut mid-line
            for line in lines:
                if b'"step"' not in line and b'"resume"' not in line:
                    continue
                e, _ = parse_line(line)
                if e is None:
                    continue
                if e["kind"] == "step":
                    reached = e["step"] if reached is None else max(reached, e["step"])
                elif e["kind"] == "resume":
                    resumed = e["step"] if resumed is None else max(resumed, e["step"])
        return reached, resumed


_GATE: list[Gate | None] = []


def _gate() -> Gate | None:
    """The launcher's gate, from the plan its environment names (None: no-progress stop off)."""
    if not _GATE:
        gate = None
        run_dir, plan = os.environ.get("RESCTL_RUN_DIR"), os.environ.get("RESCTL_PLAN")
        if run_dir and plan:
            try:
                health = json.loads(Path(plan).read_text(encoding="utf-8"))["profile"].get("health", {})
                limit = int(health.get("no_progress_cycles", 0))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                limit = 0
            gate = Gate(Path(run_dir), limit) if limit > 0 else None
        _GATE.append(gate)
    return _GATE[0]


def before_cycle() -> None:
    """The adapters' hook: stop the launcher (SIGTERM to itself, in its main thread: the handler runs
    before this returns, so no worker of the new cycle starts) when restarts made no progress."""
    gate = _gate()
    if gate is None:
        return
    verdict = gate.before_cycle()
    if verdict is None:
        return
    from resctl.errors import EXIT_NO_PROGRESS
    from resctl.launch import stop

    stop.record_fatal(gate.run_dir, {"cause": "no_progress", "error": verdict.message(), "exit_code": EXIT_NO_PROGRESS,
                                     "best_step": verdict.best, "cycles": verdict.cycles})
    os.kill(os.getpid(), signal.SIGTERM)
