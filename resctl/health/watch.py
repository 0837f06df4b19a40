"""The job's straggler watch: a thread of `resctl run` that reads the step events the workers write.

It tails `events-rank*.jsonl` (from their ends when it starts: this run's history only) every
`EVERY` seconds, in the process that outlives every worker restart, so it adds nothing to a
worker's step, and feeds `stragglers.StragglerDetector`: one console line and one `straggler` event
(in the slow rank's events file) per episode (docs/recovery.md, "Health"). With a run directory
shared by the nodes every node sees every rank; a node names only ranks its own launcher started,
so an episode is told once. (The no-progress stop is decided in the launcher: `resctl.health.gate`.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from resctl.health.stragglers import Straggler, StragglerDetector
from resctl.profile.schema import Health
from resctl.telemetry.events import EventLog
from resctl.telemetry.metrics import EventTail

EVERY = 0.5


class Watch:
    def __init__(self, run_dir: Path, health: Health, on_event: Callable[[str], None] = print) -> None:
        self.run_dir = run_dir
        self.health = health
        self.on_event = on_event
        self.tail = EventTail(run_dir)
        self.tail.skip_existing()  # an earlier run's lines (a requeue reuses the run dir)
        self.stragglers = StragglerDetector(health.straggler_margin, health.straggler_steps)
        self.named: list[Straggler] = []
        self.launcher_pid: int | None = None
        self._own: dict[int, bool] = {}  # rank -> started by this node's launcher
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def needed(self) -> bool:
        return self.health.stragglers

    def start(self, launcher_pid: int) -> None:
        self.launcher_pid = launcher_pid
        self._thread = threading.Thread(target=self._run, name="resctl-health", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, then read the last lines (a straggler named in the final steps)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self.update()

    def _run(self) -> None:
        while not self._stop.wait(EVERY):
            try:
                self.update()
            except Exception as err:  # noqa: BLE001 - a health check must never stop the job it watches
                self.on_event(f"resctl: health watch: {type(err).__name__}: {err} (continuing)")

    def update(self) -> None:
        for batch in self.tail.batches():
            for e in batch:
                kind = e["kind"]
                if kind == "start":
                    self._own[e["rank"]] = self._is_own(e.get("pid"))
                elif kind == "step":
                    found = self.stragglers.feed(e)
                    if found is not None and self._own.get(found.rank, True):
                        self._name(found)

    def _is_own(self, pid: object) -> bool:
        """A worker started by this node's launcher (its parent), or unknown: then every node tells it."""
        if not isinstance(pid, int) or self.launcher_pid is None:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True  # gone already, or no /proc: rather twice than never
        return int(stat.rsplit(")", 1)[1].split()[1]) == self.launcher_pid

    def _name(self, s: Straggler) -> None:
        self.named.append(s)
        self.on_event(f"resctl: {s.message()}")
        log = EventLog(self.run_dir, s.rank, s.cycle)
        log.iteration = s.iteration
        try:
            log.emit("straggler", step=s.step, seconds=round(s.seconds, 6), median=round(s.median, 6),
                     ratio=round(s.ratio, 4), steps=s.steps, margin=self.health.straggler_margin, measure=s.measure)
        finally:
            log.close()
