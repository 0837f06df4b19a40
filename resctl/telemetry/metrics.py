"""Prometheus metrics of a running job, served by the `resctl run` process (launcher side).

`resctl run --metrics-port 9400` (or `launch.metrics_port`) starts an HTTP endpoint before the
launcher. Every scrape reads only what the ranks appended to `events-rank*.jsonl` since the last
scrape; the goodput numbers come from the same analysis as `resctl report` (recomputed at most
every `ANALYZE_EVERY` seconds). Step events of ranks other than the lowest are dropped after
counting: data-parallel ranks make the same steps, and keeping one rank's history bounds memory.

| metric | type | meaning |
|---|---|---|
| `resctl_steps_total` | counter | optimizer steps run by the reference rank, restarts included |
| `resctl_step_seconds` | gauge | duration of the last step |
| `resctl_checkpoint_stall_seconds` | gauge | time the last save blocked the training loop |
| `resctl_checkpoint_persist_seconds` | gauge | stage-to-durable time of the last checkpoint |
| `resctl_checkpoint_bytes` | gauge | size of the last checkpoint written by a rank |
| `resctl_last_checkpoint_age_seconds` | gauge | seconds since the newest durable checkpoint |
| `resctl_checkpoints_total` | counter | durable checkpoints (reference rank) |
| `resctl_restarts_total{layer,cause}` | counter | recoveries by layer (launcher / inprocess) and cause |
| `resctl_recovery_seconds` | gauge | fault to first step of the last recovery |
| `resctl_launcher_cycle` | gauge | ft_launcher's restart count of the newest worker |
| `resctl_training_goodput_ratio` | gauge | time producing kept steps / wall time |
| `resctl_infrastructure_goodput_ratio` | gauge | time the workers were up / wall time |
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from resctl.telemetry.events import EVENTS_GLOB

ANALYZE_EVERY = 10.0


class EventTail:
    """Reads whole new lines appended to every events file of a run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._offsets: dict[Path, int] = {}

    def new_events(self) -> Iterator[dict[str, Any]]:
        if not self.run_dir.is_dir():
            return
        for path in sorted(self.run_dir.glob(EVENTS_GLOB)):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next scrape
            self._offsets[path] = offset + end
            for line in data[:end].splitlines():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue


class RunCollector:
    """A prometheus_client collector over one run directory."""

    def __init__(self, run_dir: Path, plan: dict[str, Any] | None = None, clock: Any = time.time) -> None:
        self.tail = EventTail(run_dir)
        self.plan = plan
        self.clock = clock
        self._lock = threading.Lock()
        self._kept: list[dict[str, Any]] = []
        self._ref_rank: int | None = None
        self.steps = 0
        self.last: dict[str, float] = {}
        self.checkpoints = 0
        self.cycle = 0
        self._analysis: Any = None
        self._analyzed_at = float("-inf")
        self._dirty = False

    def _ingest(self) -> None:
        for e in self.tail.new_events():
            kind, rank = e.get("kind"), int(e.get("rank", 0))
            if kind == "start":
                self.cycle = max(self.cycle, int(e.get("cycle", 0)))
                if self._ref_rank is None or rank < self._ref_rank:
                    self._ref_rank = rank
            if kind in ("step", "ckpt_persist") and rank != self._ref_rank:
                continue
            if kind == "step":
                self.steps += 1
                self.last["step_seconds"] = float(e.get("duration", 0.0))
            elif kind == "ckpt_stall":
                self.last["stall"] = float(e.get("seconds", 0.0))
            elif kind == "ckpt_persist":
                self.checkpoints += 1
                self.last["persist"] = float(e.get("seconds", 0.0))
                self.last["bytes"] = float(e.get("bytes", 0.0))
                self.last["persisted_at"] = float(e["t"])
            self._kept.append(e)
            self._dirty = True

    def analysis(self) -> Any:
        from resctl.telemetry.goodput import analyze

        now = time.monotonic()
        if self._dirty and now - self._analyzed_at >= ANALYZE_EVERY and self._kept:
            try:
                self._analysis = analyze(self._kept, self.plan)
            except ValueError:
                self._analysis = None
            self._analyzed_at, self._dirty = now, False
        return self._analysis

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            self._ingest()
            analysis = self.analysis()
        yield CounterMetricFamily("resctl_steps", "Optimizer steps run by the reference rank.", value=self.steps)
        yield CounterMetricFamily("resctl_checkpoints", "Durable checkpoints (reference rank).", value=self.checkpoints)
        yield GaugeMetricFamily("resctl_launcher_cycle", "ft_launcher restart count of the newest worker.", value=self.cycle)
        gauges = {
            "step_seconds": ("resctl_step_seconds", "Duration of the last optimizer step."),
            "stall": ("resctl_checkpoint_stall_seconds", "Time the last save blocked the training loop."),
            "persist": ("resctl_checkpoint_persist_seconds", "Stage-to-durable time of the last checkpoint."),
            "bytes": ("resctl_checkpoint_bytes", "Size of the last checkpoint."),
        }
        for key, (name, doc) in gauges.items():
            if key in self.last:
                yield GaugeMetricFamily(name, doc, value=self.last[key])
        if "persisted_at" in self.last:
            yield GaugeMetricFamily("resctl_last_checkpoint_age_seconds", "Seconds since the newest durable checkpoint.",
                                    value=max(0.0, self.clock() - self.last["persisted_at"]))
        if analysis is None:
            return
        restarts = CounterMetricFamily("resctl_restarts", "Recoveries by layer and cause.", labels=["layer", "cause"])
        counts: dict[tuple[str, str], int] = {}
        for r in analysis.recoveries:
            counts[(r.layer, r.cause)] = counts.get((r.layer, r.cause), 0) + 1
        for (layer, cause), n in sorted(counts.items()):
            restarts.add_metric([layer, cause], n)
        yield restarts
        totals = [r.total for r in analysis.recoveries if r.total is not None]
        if totals:
            yield GaugeMetricFamily("resctl_recovery_seconds", "Fault to first step of the last recovery.", value=totals[-1])
        yield GaugeMetricFamily("resctl_training_goodput_ratio", "Time producing kept steps over wall time.",
                                value=analysis.training_goodput)
        yield GaugeMetricFamily("resctl_infrastructure_goodput_ratio", "Time the workers were up over wall time.",
                                value=analysis.infrastructure_goodput)


def serve(run_dir: Path, port: int, addr: str = "0.0.0.0", plan: dict[str, Any] | None = None) -> Any:
    """Start the metrics endpoint in a daemon thread; returns the HTTP server."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(run_dir, plan))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
