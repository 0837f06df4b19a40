"""Prometheus metrics of a running job, served by the `resctl run` process (launcher side).

`resctl run --metrics-port 9400` (or `launch.metrics_port`) starts an HTTP endpoint before the
launcher. A background thread reads what the ranks appended to `events-rank*.jsonl` every
`UPDATE_EVERY` seconds and feeds it to the same streaming `Analyzer` as `resctl report`, without
calibration: its memory is bounded by the number of epochs and ranks, not by the steps. A scrape
only renders the values of the last update, so it costs the same at step 10 and at step 10
million. A damaged line is skipped and counted; the rest of its batch is read.

| metric | type | meaning |
|---|---|---|
| `resctl_steps_total` | counter | optimizer steps run by the reference rank, restarts included |
| `resctl_step_seconds` | gauge | duration of the last step |
| `resctl_checkpoint_stall_seconds` | gauge | time the last save blocked the training loop |
| `resctl_checkpoint_persist_seconds` | gauge | stage-to-durable time of the last checkpoint |
| `resctl_checkpoint_bytes` | gauge | size of the last checkpoint written by a rank |
| `resctl_last_checkpoint_age_seconds` | gauge | seconds since the newest durable checkpoint or snapshot |
| `resctl_checkpoints_total` | counter | durable checkpoints and torch.save snapshots (distinct steps) |
| `resctl_restarts_total{layer,cause}` | counter | recoveries by layer (launcher / inprocess) and cause |
| `resctl_recovery_seconds` | gauge | fault to first step of the last recovery |
| `resctl_launcher_cycle` | gauge | ft_launcher's restart count of the newest worker |
| `resctl_training_goodput_ratio` | gauge | time producing kept steps / wall time |
| `resctl_infrastructure_goodput_ratio` | gauge | time the workers were up / wall time |
| `resctl_event_lines_damaged_total` | counter | lines of the events files skipped as damaged |
| `resctl_checkpoint_failures_total` | counter | checkpoint writes that failed (`ckpt_fail`) |
| `resctl_checkpoints_skipped_total` | counter | checkpoints a load refused as damaged or unusable (`ckpt_skip`) |
| `resctl_rank_step_seconds{rank}` | gauge | each rank's recent step time (median of its last few steps) |
| `resctl_stragglers` | gauge | ranks named as stragglers in this run (`straggler` events of the health watch) |
"""

from __future__ import annotations

import heapq
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from resctl.telemetry.events import Event, ReadStats, parse_line, rank_files
from resctl.telemetry.goodput import Analyzer
from resctl.telemetry.ranks import RecentSteps

UPDATE_EVERY = 1.0
BATCH_BYTES = 1 << 20  # read this much of each file at a time (a backlog is read in several batches)


class EventTail:
    """Reads whole new lines appended to every events file of a run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.stats = ReadStats()
        self._offsets: dict[Path, int] = {}
        self._lines: dict[Path, int] = {}

    def skip_existing(self) -> None:
        """Start at the current end of every file (a reader that wants only what is appended from now on)."""
        for path in rank_files(self.run_dir).values():
            try:
                self._offsets[path] = path.stat().st_size
            except OSError:
                pass

    def batches(self) -> Iterator[list[Event]]:
        """The valid records appended since the last call, in batches of at most `BATCH_BYTES` of each
        file, each merged by time (memory stays bounded however long the backlog)."""
        if not self.run_dir.is_dir():
            return
        paths = list(rank_files(self.run_dir).values())
        while True:
            before = sum(self._offsets.get(p, 0) for p in paths)
            batch = list(heapq.merge(*(self._read(path) for path in paths), key=lambda e: e["t"]))
            if batch:
                yield batch
            if sum(self._offsets.get(p, 0) for p in paths) == before:
                return

    def _read(self, path: Path) -> list[Event]:
        offset = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read(BATCH_BYTES)
        except OSError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next update
        if end == 0 and len(data) == BATCH_BYTES:
            end = len(data)  # one line longer than a batch: damaged, skip it
        self._offsets[path] = offset + end
        out = []
        for line in data[:end].split(b"\n"):
            if not line.strip():
                continue
            n = self._lines[path] = self._lines.get(path, 0) + 1
            self.stats.lines += 1
            event, why = parse_line(line)
            if event is None:
                self.stats.skip(path, n, why)
            else:
                out.append(event)
        return out


class RunCollector:
    """A prometheus_client collector over one run directory; `update()` ingests, `collect()` renders."""

    def __init__(self, run_dir: Path, plan: dict[str, Any] | None = None, clock: Any = time.time) -> None:
        self.tail = EventTail(run_dir)
        self.plan = plan
        self.clock = clock
        self.analyzer = Analyzer(plan=plan, calibrate=False, history=False)
        self._lock = threading.Lock()
        self._update_lock = threading.Lock()
        self.last: dict[str, float] = {}
        self.cycle = 0
        self._values: dict[str, Any] = {}
        self._stop = threading.Event()
        self.rank_steps = RecentSteps()
        self.stragglers: set[int] = set()
        self.error: Exception | None = None  # the last update's failure (the next one retries)

    @property
    def steps(self) -> int:
        return self.analyzer.freshness.ref_steps

    @property
    def checkpoints(self) -> int:
        return len(self.analyzer.freshness.durable_steps)

    def update(self) -> None:
        """Read new lines, feed them to the analysis, publish the values a scrape renders."""
        with self._update_lock:
            fed = 0
            for batch in self.tail.batches():
                for e in batch:
                    self._note(e)
                    self.analyzer.feed(e)
                fed += len(batch)
            if not fed and self._values:
                return
            values = self._compute()
        with self._lock:
            self._values = values

    def _note(self, e: Event) -> None:
        kind = e["kind"]
        if kind == "start":
            self.cycle = max(self.cycle, e["cycle"])
        elif kind == "step":
            self.rank_steps.feed(e)
        elif kind == "straggler":
            self.stragglers.add(e["rank"])
        ref = self.analyzer.ref
        if kind == "step" and (ref is None or e["rank"] <= ref):
            self.last["step_seconds"] = e["duration"]
        elif kind == "ckpt_stall":
            self.last["stall"] = e["seconds"]
        elif kind == "ckpt_mem" and (ref is None or e["rank"] <= ref):
            self.last["mem_stall"] = e["seconds"]
        elif kind in ("ckpt_persist", "snapshot") and (ref is None or e["rank"] <= ref):
            self.last["persist"] = e["seconds"]
            if e["bytes"] is not None:
                self.last["bytes"] = float(e["bytes"])

    def _compute(self) -> dict[str, Any]:
        a = self.analyzer
        fresh, saves = a.freshness, a.saves
        values: dict[str, Any] = {"steps": fresh.ref_steps, "checkpoints": len(fresh.durable_steps),
                                  "cycle": self.cycle, "damaged": self.tail.stats.damaged, "last": dict(self.last),
                                  "failed_saves": saves.failed, "skipped": saves.skipped,
                                  "persisted_at": fresh.latest[0] if fresh.latest else None,
                                  "rank_steps": self.rank_steps.recent(), "stragglers": len(self.stragglers)}
        if a.events:
            r = a.result(series=False)
            counts: dict[tuple[str, str], int] = {}
            for rec in r.recoveries:
                counts[(rec.layer, rec.cause)] = counts.get((rec.layer, rec.cause), 0) + 1
            totals = [rec.total for rec in r.recoveries if rec.total is not None]
            tiers: dict[str, int] = {}
            rolled: dict[str, int] = {}
            for rec in r.recoveries:
                tiers[rec.tier or "none"] = tiers.get(rec.tier or "none", 0) + 1
                rolled[rec.tier or "none"] = rolled.get(rec.tier or "none", 0) + rec.rollback_steps
            values.update(restarts=counts, recovery=totals[-1] if totals else None, tiers=tiers, rolled=rolled,
                          rollback=r.recoveries[-1].rollback_steps if r.recoveries else None,
                          last_tier=(r.recoveries[-1].tier or "none") if r.recoveries else None,
                          training=r.training_goodput, infrastructure=r.infrastructure_goodput)
        return values

    def run(self, every: float = UPDATE_EVERY) -> None:
        """Update every `every` seconds until `stop()` (the serving thread's loop)."""
        while not self._stop.is_set():
            try:
                self.update()
            except Exception as err:  # noqa: BLE001 - metrics must never stop; the next update retries
                self.error = err
            self._stop.wait(every)

    def stop(self) -> None:
        self._stop.set()

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            v = self._values
        if not v:
            return
        yield CounterMetricFamily("resctl_steps", "Optimizer steps run by the reference rank.", value=v["steps"])
        yield CounterMetricFamily("resctl_checkpoints", "Durable checkpoints and torch.save snapshots.",
                                  value=v["checkpoints"])
        yield GaugeMetricFamily("resctl_launcher_cycle", "ft_launcher restart count of the newest worker.", value=v["cycle"])
        yield CounterMetricFamily("resctl_event_lines_damaged", "Lines of the events files skipped as damaged.",
                                  value=v["damaged"])
        yield CounterMetricFamily("resctl_checkpoint_failures", "Checkpoint writes that failed.",
                                  value=v["failed_saves"])
        yield CounterMetricFamily("resctl_checkpoints_skipped", "Checkpoints a load refused as damaged or unusable.",
                                  value=v["skipped"])
        gauges = {
            "step_seconds": ("resctl_step_seconds", "Duration of the last optimizer step."),
            "stall": ("resctl_checkpoint_stall_seconds", "Time the last save blocked the training loop."),
            "mem_stall": ("resctl_memory_snapshot_stall_seconds", "Time the last memory-tier snapshot blocked the loop."),
            "persist": ("resctl_checkpoint_persist_seconds", "Stage-to-durable time of the last checkpoint."),
            "bytes": ("resctl_checkpoint_bytes", "Size of the last checkpoint."),
        }
        for key, (name, doc) in gauges.items():
            if key in v["last"]:
                yield GaugeMetricFamily(name, doc, value=v["last"][key])
        yield GaugeMetricFamily("resctl_stragglers", "Ranks named as stragglers in this run.", value=v["stragglers"])
        if v["rank_steps"]:
            per_rank = GaugeMetricFamily("resctl_rank_step_seconds", "Each rank's recent step time (median of its "
                                         "last few steps).", labels=["rank"])
            for rank, seconds in v["rank_steps"].items():
                per_rank.add_metric([str(rank)], seconds)
            yield per_rank
        if v["persisted_at"] is not None:
            yield GaugeMetricFamily("resctl_last_checkpoint_age_seconds", "Seconds since the newest durable checkpoint.",
                                    value=max(0.0, self.clock() - v["persisted_at"]))
        if "restarts" not in v:
            return
        restarts = CounterMetricFamily("resctl_restarts", "Recoveries by layer and cause.", labels=["layer", "cause"])
        for (layer, cause), n in sorted(v["restarts"].items()):
            restarts.add_metric([layer, cause], n)
        yield restarts
        by_tier = CounterMetricFamily("resctl_recoveries_by_tier", "Recoveries by where the resumed state came from "
                                      "(memory, buddy, disk, several joined by +, none).", labels=["tier"])
        for tier, n in sorted(v["tiers"].items()):
            by_tier.add_metric([tier], n)
        yield by_tier
        rolled = CounterMetricFamily("resctl_rolled_back_steps", "Steps rolled back by recoveries, by the tier their "
                                     "state came from.", labels=["tier"])
        for tier, n in sorted(v["rolled"].items()):
            rolled.add_metric([tier], n)
        yield rolled
        if v["rollback"] is not None:
            last = GaugeMetricFamily("resctl_rollback_steps", "Steps the last recovery rolled back (label: its tier).",
                                     labels=["tier"])
            last.add_metric([v["last_tier"]], v["rollback"])
            yield last
        if v["recovery"] is not None:
            yield GaugeMetricFamily("resctl_recovery_seconds", "Fault to first step of the last recovery.", value=v["recovery"])
        yield GaugeMetricFamily("resctl_training_goodput_ratio", "Time producing kept steps over wall time.",
                                value=v["training"])
        yield GaugeMetricFamily("resctl_infrastructure_goodput_ratio", "Time the workers were up over wall time.",
                                value=v["infrastructure"])


def serve(run_dir: Path, port: int, addr: str = "0.0.0.0", plan: dict[str, Any] | None = None,
          every: float = UPDATE_EVERY) -> Any:
    """Start the metrics endpoint and its update thread (both daemons); returns the HTTP server.
    The first values are read before it returns."""
    from prometheus_client import CollectorRegistry, start_http_server

    collector = RunCollector(run_dir, plan)
    collector.update()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    threading.Thread(target=collector.run, args=(every,), name="resctl-metrics", daemon=True).start()
    server.resctl_collector = collector  # type: ignore[attr-defined]
    return server
