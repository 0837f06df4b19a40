"""Goodput, recovery and calibration numbers computed from a run's events.

`analyze(events, plan)` turns the records of `events-rank*.jsonl` (see `resctl.telemetry.events`)
into a `RunAnalysis`; `resctl report` renders it and `resctl tune-interval --from-run` takes its
`calibration`. It is one pass over the events in time order (`Analyzer.feed`), keeping aggregates
per epoch and a bounded sample of each epoch's steps, so a run of any length is read in linear
time; the Prometheus metrics feed the same `Analyzer` as lines arrive. The `Analyzer` dispatches
each event to one accumulator per concern: the epochs (`telemetry/epochs.py`), the recoveries
between them (`telemetry/recovery.py`), the calibration (`telemetry/calibration.py`: step compute,
saves, write interference) and the durable checkpoints' freshness (`telemetry/freshness.py`).
Definitions:

- **Epoch**: the events of one `(cycle, iteration)`: a launcher cycle (`cycle` = ft_launcher's
  restart count) or an in-process restart iteration within it. Every change of epoch is one
  recovery, of layer `launcher` (new cycle) or `inprocess` (new iteration).
- **Reference rank**: the lowest rank present. Step accounting uses its events only: in data
  parallel training every rank makes the same steps, and rank 0 is the one that writes plain
  checkpoints, so its step durations contain the real checkpoint stalls.
- **Step compute**: a step event's `duration` (time since the previous step) minus the
  `ckpt_stall` seconds recorded between the two; the first step of an epoch is not a sample
  (its duration contains start-up or recovery).
- **Durable checkpoint**: a `ckpt_persist` with a step, or a snapshot the script wrote itself
  with `torch.save` (`resctl.telemetry.snapshots`: at the step the shim counted when it was saved).
- **Calibration**: the save stall is the mean over each epoch's saves after its first (the first
  also allocates the staging arena); write time and size are means over all checkpoints. A
  script's own torch.save snapshot is a synchronous save: its time is both stall and write.
  Write interference: a reference-rank step's compute (its span since the previous step minus
  the save stalls in it) is split into time inside a write window (`ckpt_persist`: `[t - seconds,
  t]`, any rank) and time outside, by one sweep over both in time order. Steps with no overlap
  (under 1 % of their compute) give `c_0`, their mean compute; the others give `c_w` =
  overlapped time / the step work done in it, where a step's work outside the window is its
  outside time / `c_0`. `write_slowdown = c_w / c_0`. None when fewer than 3 steps of either kind.
- **Memory tier**: a reference-rank `ckpt_mem` blocked the loop for `[t - commit - seconds,
  t - commit]` (the event is written when its background commit ends); that time is a save stall
  and is taken out of step compute like a `ckpt_stall`, from the first step recorded after the
  event (a commit longer than a step moves it to a later step than the one it blocked: the mean
  step compute is the same). Calibration: the snapshot stall is
  the mean of `seconds - waited` over each epoch's snapshots after its first (the first also maps
  the slot), `commit` and `bytes` are means over all; the memory interval is plan.json's
  `checkpoint.memory_every`, else the most common gap between snapshot steps.
- **Kept step**: a step not rolled back, i.e. not above the step a later epoch resumed from.
- **Training goodput**: kept steps x their compute (the first step of an epoch counts the mean
  step compute), over the wall time from the first `start` to the last event.
- **Infrastructure goodput**: time the workers were up, over the same wall time. A launcher cycle
  is up from its last rank's `start` to its last event; in-process restarts keep the workers up.
  The series gives both goodputs so far at every reference-rank step (`goodput`, `infra`).
- **Cause of a recovery**: the fault that started it, in this order: a fault drill's (injected);
  a worker's own error; a rank that ended without any record before a launcher restart (`killed`:
  a signal, the OOM killer or a heartbeat timeout), timed at its last record; a collective error
  on a rank whose peer failed ("Connection closed by peer", DistBackendError, ...); SIGTERM.
- **Recovery of one fault** (fault -> first step), in four phases:
  detection: the fault to the moment the old epoch stopped (launcher: when a launcher saw the
  failure, `start`'s `detected`; in runs without it the first `sigterm` fault or `end` of a
  surviving rank, else the old epoch's last event; in-process: the first `restart`
  event, so NVRx's teardown and barrier count here); restart: to the last rank's `start`
  (launcher) or `restart` (in-process); checkpoint load: to the last rank's `resume`; first
  step: to the last rank's first step. A fault without a record is timed from the old epoch's
  last step written (a SIGKILLed rank's last `STEP_FLUSH_EVERY` = 0.1 s of steps die with it:
  detection reads up to that much long).
- **Phases of the restart** (the same split bench/scale measures at N simulated nodes), launcher
  recoveries: stop, detection to the last launcher's `stopped` (its workers gone; without it, the old
  epoch's last record); rendezvous, to
  the first new worker process created (`start`'s `spawned`: the launchers' rendezvous and rank
  assignment are done); start workers, to the last rank's `start`. Without `spawned` (runs
  before it existed) the rendezvous runs to the last `start` and start workers is None.
  In-process: stop is None, rendezvous is the first to the last rank's `restart` (the wrapper's
  barrier). stop + rendezvous + start workers = restart.
- **Rollback**: the highest step the old epoch reached minus the step it resumed from.
- **Checkpoint freshness**: at every reference-rank step, how many steps and seconds ago the
  newest durable checkpoint was taken (from the run's start when none yet).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from resctl.profile import contract
from resctl.telemetry.calibration import (
    Calibration,
    Interference,
    Saves,
    StepSamples,
    percentile,
)
from resctl.telemetry.epochs import METRICS_TRACK_CAP, TRACK_CAP, Epoch, EpochKey, Epochs, Kept
from resctl.telemetry.events import Event, as_events
from resctl.telemetry.freshness import SERIES_CAP, Freshness
from resctl.telemetry.recovery import (
    KILLED,
    NO_FAULT_EVENT,
    PEER_ERROR,
    RECOVERY_PHASES,
    RECOVERY_STATS,
    Recovery,
    recovery,
)
from resctl.telemetry.snapshots import Durable, SnapshotLedger

__all__ = [  # the report's, the metrics' and the tuning's names, from here as before the split
    "KILLED", "NO_FAULT_EVENT", "PEER_ERROR", "RECOVERY_PHASES", "RECOVERY_STATS", "SERIES_CAP", "TRACK_CAP",
    "METRICS_TRACK_CAP", "Analyzer", "Calibration", "EpochKey", "Recovery", "RunAnalysis", "Sample", "analyze",
    "analyze_stream", "percentile",
]

TIMELINE_KINDS = ("start", "ckpt_persist", "snapshot", "fault", "restart", "ckpt_load", "resume", "end", "ckpt_skip")


@dataclass(frozen=True)
class Sample:
    """One point of the goodput / freshness series (reference rank, at a step)."""

    t: float
    step: int
    goodput: float
    age_steps: int
    age_s: float
    kept: bool
    infra: float = 0.0  # infrastructure goodput so far: time the workers were up / time since the start


@dataclass
class RunAnalysis:
    wall_s: float
    training_goodput: float
    infrastructure_goodput: float
    productive_s: float
    up_s: float
    kept_steps: int
    steps_run: int
    final_step: int
    recoveries: list[Recovery]
    recovery_stats: dict[str, dict[str, float | None]]
    rollback_stats: dict[str, float | None]
    freshness: dict[str, float | None]
    causes: dict[str, int]
    checkpoints: int
    calibration: Calibration
    timeline: list[dict[str, Any]]
    series: list[Sample] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    t0: float = 0.0
    snapshots: int = 0  # of `checkpoints`: the script's own torch.save snapshots
    damaged_lines: int = 0  # lines of the events files that were skipped (see `events.ReadStats`)
    failed_saves: int = 0  # ckpt_fail events: checkpoint writes that failed (retried at the next interval)
    skipped_checkpoints: int = 0  # ckpt_skip events: checkpoints a load refused (damaged: quarantined)
    last_save_error: str | None = None

    def to_json(self, series: bool = True) -> dict[str, Any]:
        data = asdict(self)
        if not series:
            data.pop("series")
        return data


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    return {"count": float(len(values)), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values) if values else None, "mean": sum(values) / len(values) if values else None}


#: Events that time a recovery (the epochs' accumulator takes them).
LIFECYCLE = ("start", "restart", "ckpt_load", "resume", "fault", "end")
#: Events after which the reference rank's next step is a first step (no compute sample).
RESTARTS = ("start", "resume", "restart")

Route = Callable[[Epoch, Event, int], None]


class Analyzer:
    """Streaming analysis: `feed` every event in time order, then `result()` (any number of times).

    One dispatcher over one accumulator per concern: `epochs` (the epochs and their aggregates),
    `samples` (step compute), `saves` (stalls, writes and failures of each kind of save),
    `interference` (step pieces and write windows), `freshness` (durable checkpoints and their age).
    `calibrate=False, history=False` (the metrics) keeps no per-step data: memory is bounded by the
    number of epochs, ranks, checkpoint steps and paths in flight. `calibrate=True` also keeps one
    float per reference step for the step-time median and the write-interference sweep; `history`
    the timeline (no steps) and a series of at most `SERIES_CAP` points.
    """

    def __init__(self, ref: int | None = None, plan: Mapping[str, Any] | None = None, calibrate: bool = True,
                 history: bool = True) -> None:
        self.ref = ref
        self.plan = plan
        self.calibrate = calibrate
        self.history = history  # keep the timeline and the series (the report; not the metrics)
        self.epochs = Epochs(TRACK_CAP if calibrate else METRICS_TRACK_CAP)
        self.samples = StepSamples(keep=calibrate)
        self.saves = Saves()
        self.interference = Interference()
        self.freshness = Freshness(history)
        self.ledger = SnapshotLedger()  # which torch.save snapshot is durable at which step
        self.ranks: set[int] = set()
        self.events = 0
        self.timeline: list[Event] = []
        self._routes: dict[str, Route] = {
            "ckpt_stall": self._stall, "ckpt_mem": self._mem, "ckpt_persist": self._persist,
            "ckpt_fail": self._fail, "ckpt_skip": self._skip, **{kind: self._lifecycle for kind in LIFECYCLE},
        }

    # -- feeding -----------------------------------------------------------------------------
    def feed(self, e: Event) -> None:
        kind, rank = e["kind"], e["rank"]
        self.events += 1
        if rank not in self.ranks:
            self.ranks.add(rank)
            if self.ref is None or rank < self.ref:
                self.ref = rank  # streaming without a rank list: the lowest seen so far
        ep = self.epochs.enter(e)
        if kind == "step":
            self._step(ep, e, rank)
            return
        route = self._routes.get(kind)
        if route is not None:
            route(ep, e, rank)
        if kind in RESTARTS and rank == self.ref:
            ep.restart_accounting()
        durable = self.ledger.feed(e)
        if durable is not None:
            self._durable_snapshot(ep, durable)
        if self.history and kind in TIMELINE_KINDS:
            self.timeline.append(e)

    def _step(self, ep: Epoch, e: Event, rank: int) -> None:
        self.epochs.step(ep, e, rank)
        if rank != self.ref:
            return
        t, step = e["t"], e["step"]
        compute = None
        if not ep.first:
            stalls = ep.stalls
            compute = e["duration"] - sum(b - a for a, b in stalls) if stalls else e["duration"]
            if compute < 0.0:
                compute = 0.0
            self.samples.add(compute)
            if self.calibrate and ep.prev_t is not None and t > ep.prev_t:
                self.interference.step(ep.prev_t, t, stalls)
        ep.track.add(step, compute)
        ep.first, ep.prev_t = False, t
        if ep.stalls:
            ep.stalls = []
        start = self.epochs.t0 if self.epochs.t0 is not None else (self.epochs.t_first or t)
        self.freshness.step(ep.key, t, step, start)

    def _lifecycle(self, ep: Epoch, e: Event, rank: int) -> None:
        self.epochs.lifecycle(ep, e, e["kind"], rank)

    def _stall(self, ep: Epoch, e: Event, rank: int) -> None:
        if rank != self.ref:
            return
        seconds, waited = e["seconds"], e["waited"] or 0.0
        ep.stalls.append((e["t"] - seconds, e["t"]))
        self.saves.ckpt.stall(ep.key, max(0.0, seconds - waited), waited)
        if e["path"] is None:  # resctl.checkpoint.save; an intercepted torch.save's step is its snapshot's
            self.saves.engine_saves += 1
            if e["step"] is not None:
                self.saves.ckpt.steps.add(e["step"])

    def _mem(self, ep: Epoch, e: Event, rank: int) -> None:
        if rank != self.ref:
            return
        seconds, waited, commit = e["seconds"], e["waited"] or 0.0, e["commit"] or 0.0
        end = e["t"] - commit
        ep.stalls.append((end - seconds, end))
        self.saves.mem.stall(ep.key, max(0.0, seconds - waited), waited)
        self.saves.mem.steps.add(e["step"])
        if e["commit"] is not None:
            self.saves.commit.add(commit)
        if e["bytes"] is not None:
            self.saves.size.add(e["bytes"])

    def _persist(self, ep: Epoch, e: Event, rank: int) -> None:
        t, seconds = e["t"], e["seconds"]
        if e["path"] is None and e["step"] is not None:
            self.freshness.durable(t, e["step"])
        if not self.calibrate:
            return
        if seconds > 0:
            self.interference.window(t - seconds, t)
        self.saves.ckpt.write(ep.key, e["step"] if e["path"] is None else None, seconds, e["bytes"] or 0,
                              bool(e["recycled"]))

    def _fail(self, ep: Epoch, e: Event, rank: int) -> None:
        self.saves.failed += 1
        self.saves.last_error = e["error"]

    def _skip(self, ep: Epoch, e: Event, rank: int) -> None:
        self.saves.skipped += 1

    def _durable_snapshot(self, ep: Epoch, d: Durable) -> None:
        self.freshness.durable(d.t, d.step)
        self.freshness.snapshot_steps.add(d.step)
        stats = self.saves.ckpt if d.intercepted else self.saves.plain
        if d.rank == self.ref:
            stats.steps.add(d.step)
        if d.intercepted:
            return  # its ckpt_stall and ckpt_persist were counted as they came
        if d.seconds > 0 and self.calibrate:
            self.interference.window(d.t - d.seconds, d.t)
        if d.rank == self.ref:
            # A plain torch.save blocks the script for the whole write.
            ep.stalls.append((d.t - d.seconds, d.t))
            self.saves.plain.stall(ep.key, d.seconds, 0.0)
        if self.calibrate:
            self.saves.plain.write(ep.key, None, d.seconds, d.bytes or 0, False)

    # -- results -----------------------------------------------------------------------------
    def result(self, damaged_lines: int = 0, series: bool = True) -> RunAnalysis:
        if not self.events or self.epochs.t_end is None:
            raise ValueError("the run has no events")
        t0 = self.epochs.start()
        wall = max(self.epochs.t_end - t0, 1e-9)
        eps = self.epochs.ordered()
        mean_step = self.samples.mean()
        kept = Epochs.kept(eps, mean_step)
        spans = Epochs.up_spans(eps)
        recoveries = [recovery(a, b, t0) for a, b in zip(eps, eps[1:])]
        done = [r for r in recoveries if r.total is not None]  # the new epoch made a step
        return RunAnalysis(
            wall_s=wall, training_goodput=kept.compute / wall,
            infrastructure_goodput=sum(end - begin for begin, end in spans) / wall,
            productive_s=kept.compute, up_s=sum(end - begin for begin, end in spans), kept_steps=kept.steps,
            steps_run=kept.steps_run,
            final_step=max((ep.track.last_step for ep in eps if ep.track.last_step is not None), default=0),
            recoveries=recoveries,
            recovery_stats={key: _stats([v for r in done if (v := getattr(r, key)) is not None])
                            for key, _ in RECOVERY_STATS},
            rollback_stats=_stats([float(r.rollback_steps) for r in recoveries]),
            freshness=self.freshness.stats(),
            causes=dict(Counter(f"{r.layer}: {r.cause}" for r in recoveries)),
            checkpoints=len(self.freshness.durable_steps),
            calibration=self._calibration(recoveries, wall),
            timeline=[_timeline_row(e, t0) for e in self.timeline],
            series=self._series(eps, kept, spans, mean_step, t0) if series else [],
            ranks=sorted(self.ranks), t0=t0,
            snapshots=len(self.freshness.snapshot_steps), damaged_lines=damaged_lines,
            failed_saves=self.saves.failed, skipped_checkpoints=self.saves.skipped,
            last_save_error=self.saves.last_error,
        )

    def _series(self, eps: list[Epoch], kept: Kept, spans: list[tuple[float, float]], mean_step: float,
                t0: float) -> list[Sample]:
        index = {ep.key: i for i, ep in enumerate(eps)}
        points = []
        for p in self.freshness.series:
            i = index[p.epoch]
            _, c = eps[i].track.upto(min(p.step, kept.cutoffs[i]), mean_step)
            since = max(p.t - t0, 1e-9)
            up = sum(max(0.0, min(p.t, end) - begin) for begin, end in spans)
            points.append(Sample(p.t - t0, p.step, (kept.before[i] + c) / since, p.age_steps, p.age_s,
                                 p.step <= kept.cutoffs[i], up / since))
        return points

    def _calibration(self, recoveries: list[Recovery], wall: float) -> Calibration:
        return self.saves.calibration(
            contract.planned_checkpoint(self.plan), bool(self.freshness.snapshot_steps), self.samples,
            self.interference.sweep() if self.calibrate else (None, None, 0, 0),
            [r.total for r in recoveries if r.total is not None], sum(1 for r in recoveries if not r.injected),
            wall)


def analyze(records: Iterable[Mapping[str, Any]], plan: Mapping[str, Any] | None = None) -> RunAnalysis:
    """Everything `resctl report` shows, from a run's records (any order; each is validated
    against `events.KINDS`, invalid ones are skipped) and its plan.json."""
    events = sorted(as_events(records), key=lambda e: (e["t"], e["rank"]))
    return analyze_stream(events, plan, ref=min((e["rank"] for e in events), default=None))


def analyze_stream(events: Iterable[Event], plan: Mapping[str, Any] | None = None, *, ref: int | None,
                   damaged_lines: int = 0) -> RunAnalysis:
    """`analyze` over validated events in time order (`events.read_run`), in one pass."""
    analyzer = Analyzer(ref, plan if isinstance(plan, Mapping) else None)
    for e in events:
        analyzer.feed(e)
    return analyzer.result(damaged_lines)


def _timeline_row(e: Event, t0: float) -> dict[str, Any]:
    row = {"t": round(e["t"] - t0, 6), "rank": e["rank"], "cycle": e["cycle"], "iteration": e["iteration"],
           "kind": e["kind"]}
    for k in ("step", "cause", "layer", "status", "seconds", "reason", "injected", "path", "source", "tier"):
        if e.get(k) is not None:
            row[k] = e[k]
    return row
