"""Goodput, recovery and calibration numbers computed from a run's events (pure functions).

`analyze(events, plan)` turns the records of `events-rank*.jsonl` (see `resctl.telemetry.events`)
into a `RunAnalysis`; `resctl report` renders it and `resctl tune-interval --from-run` takes its
`calibration`. Definitions:

- **Epoch**: the events of one `(cycle, iteration)`: a launcher cycle (`cycle` = ft_launcher's
  restart count) or an in-process restart iteration within it. Every change of epoch is one
  recovery, of layer `launcher` (new cycle) or `inprocess` (new iteration).
- **Reference rank**: the lowest rank present. Step accounting uses its events only: in data
  parallel training every rank makes the same steps, and rank 0 is the one that writes plain
  checkpoints, so its step durations contain the real checkpoint stalls.
- **Step compute**: a step event's `duration` (time since the previous step) minus the
  `ckpt_stall` seconds recorded between the two; the first step of an epoch is not a sample
  (its duration contains start-up or recovery).
- **Calibration**: the save stall is the mean over each epoch's saves after its first (the first
  also allocates the staging arena); write time and size are means over all checkpoints.
  Write interference: a reference-rank step's compute (its span since the previous step minus
  the save stalls in it) is split into time inside a write window (`ckpt_persist`: `[t - seconds,
  t]`, any rank) and time outside. Steps with no overlap (under 1 % of their compute) give `c_0`,
  their mean compute; the others give `c_w` = overlapped time / the step work done in it, where a
  step's work outside the window is its outside time / `c_0`. `write_slowdown = c_w / c_0`.
  None when fewer than 3 steps of either kind exist.
- **Kept step**: a step not rolled back, i.e. not above the step a later epoch resumed from.
- **Training goodput**: kept steps x their compute (the first step of an epoch counts the mean
  step compute), over the wall time from the first `start` to the last event.
- **Infrastructure goodput**: time the workers were up, over the same wall time. A launcher cycle
  is up from its last rank's `start` to its last event; in-process restarts keep the workers up.
- **Recovery of one fault** (fault -> first step), in four phases:
  detection: the fault to the moment the old epoch stopped (launcher: the first `sigterm` fault
  or `end` of a surviving rank, else the old epoch's last event; in-process: the first `restart`
  event, so NVRx's teardown and barrier count here); restart: to the last rank's `start`
  (launcher) or `restart` (in-process); checkpoint load: to the last rank's `resume`; first
  step: to the last rank's first step. A fault without a `fault` event (SIGKILL by the OOM
  killer, a heartbeat timeout) is timed from the old epoch's last step.
- **Rollback**: the highest step the old epoch reached minus the step it resumed from.
- **Checkpoint freshness**: at every reference-rank step, how many steps and seconds ago the
  newest durable checkpoint (`ckpt_persist`) was taken (from the run's start when none yet).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping, Sequence

Event = Mapping[str, Any]
EpochKey = tuple[int, int]

NO_FAULT_EVENT = "unrecorded"  # cause when no rank wrote a fault event (signal, OOM kill, heartbeat timeout)


@dataclass(frozen=True)
class Recovery:
    """One fault and the recovery that followed it (times in seconds)."""

    layer: str  # "launcher" or "inprocess"
    cause: str
    rank: int | None  # rank that recorded the fault first (None when none did)
    t_fault: float  # seconds since run start
    detection: float
    restart: float
    load: float
    first_step: float | None  # None: the new epoch never made a step
    total: float | None
    last_step: int  # highest step reached before the fault
    resumed_step: int
    rollback_steps: int
    injected: bool


@dataclass(frozen=True)
class Calibration:
    """Measured inputs of the interval model (seconds)."""

    step_time: float  # mean step compute of the reference rank
    step_time_p50: float
    step_samples: int
    stall: float | None  # mean time a save blocked, minus its wait for the previous save
    waited: float | None  # mean wait for the previous save (back-pressure seen in the run)
    write: float | None  # mean stage-to-durable time of a checkpoint (max over ranks per step)
    write_bytes: float | None
    saves: int
    interval_steps: int | None  # from plan.json, else the most common gap between saves
    async_: bool | None
    restart: float | None  # mean fault-to-first-step of the recoveries
    unplanned_faults: int  # recoveries not caused by an injected fault (for an observed MTBF)
    wall_s: float
    step_time_idle: float | None = None  # c_0: mean compute of steps that overlap no write
    step_time_writing: float | None = None  # c_w: compute per step while a write runs
    write_slowdown: float | None = None  # c_w / c_0 (None: too few steps of either kind)
    idle_samples: int = 0
    writing_samples: int = 0


@dataclass(frozen=True)
class Sample:
    """One point of the goodput / freshness series (reference rank, at a step)."""

    t: float
    step: int
    goodput: float
    age_steps: int
    age_s: float
    kept: bool


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

    def to_json(self, series: bool = True) -> dict[str, Any]:
        data = asdict(self)
        if not series:
            data.pop("series")
        return data


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _stats(values: Sequence[float]) -> dict[str, float | None]:
    return {"count": float(len(values)), "p50": percentile(values, 50), "p95": percentile(values, 95),
            "max": max(values) if values else None, "mean": sum(values) / len(values) if values else None}


def _key(e: Event) -> EpochKey:
    return int(e.get("cycle", 0)), int(e.get("iteration", 0))


def _cause(faults: list[Event]) -> tuple[str, int | None, bool, float | None]:
    """(cause, rank, injected, t) of the fault that started a recovery; sigterm only when alone."""
    primary = [f for f in faults if f.get("cause") != "sigterm"] or faults
    if not primary:
        return NO_FAULT_EVENT, None, False, None
    first = min(primary, key=lambda f: f["t"])
    return str(first.get("cause", "?")), int(first["rank"]), bool(first.get("injected", False)), float(first["t"])


def analyze(events: Iterable[Event], plan: Mapping[str, Any] | None = None) -> RunAnalysis:
    """Everything `resctl report` shows, from a run's events (any order) and its plan.json."""
    evs = sorted((e for e in events if "t" in e and "kind" in e), key=lambda e: (float(e["t"]), int(e.get("rank", 0))))
    if not evs:
        raise ValueError("the run has no events")
    t0 = min((float(e["t"]) for e in evs if e["kind"] == "start"), default=float(evs[0]["t"]))
    t_end = float(evs[-1]["t"])
    wall = max(t_end - t0, 1e-9)
    ranks = sorted({int(e.get("rank", 0)) for e in evs})
    ref = ranks[0]

    epochs: dict[EpochKey, list[Event]] = defaultdict(list)
    for e in evs:
        epochs[_key(e)].append(e)
    order = sorted(epochs)

    # Reference-rank steps with compute = duration - stalls since the previous step.
    ref_steps: dict[EpochKey, list[tuple[float, int, float | None]]] = defaultdict(list)  # (t, step, compute)
    samples: list[float] = []
    for key in order:
        pending_stall = 0.0
        first = True
        for e in epochs[key]:
            if int(e.get("rank", 0)) != ref:
                continue
            kind = e["kind"]
            if kind == "ckpt_stall":
                pending_stall += float(e.get("seconds", 0.0))
            elif kind in ("start", "resume", "restart"):
                first = True
                pending_stall = 0.0
            elif kind == "step":
                compute = None if first else max(0.0, float(e.get("duration", 0.0)) - pending_stall)
                if compute is not None:
                    samples.append(compute)
                ref_steps[key].append((float(e["t"]), int(e["step"]), compute))
                first = False
                pending_stall = 0.0
    mean_step = sum(samples) / len(samples) if samples else 0.0

    resume_of: dict[EpochKey, int | None] = {}
    for key in order:
        resumes = [int(e["step"]) for e in epochs[key] if e["kind"] == "resume"]
        steps = ref_steps[key]
        if resumes:
            resume_of[key] = min(resumes)
        elif steps:
            resume_of[key] = steps[0][1] - 1
        else:
            resume_of[key] = None

    # Kept steps: not above any later epoch's resume point.
    kept: list[tuple[float, int, float]] = []
    steps_run = 0
    for i, key in enumerate(order):
        later = [r for k in order[i + 1:] if (r := resume_of[k]) is not None]
        cutoff: float = min(later) if later else math.inf
        for t, step, compute in ref_steps[key]:
            steps_run += 1
            if step <= cutoff:
                kept.append((t, step, mean_step if compute is None else compute))
    productive = sum(c for _, _, c in kept)

    # Up time per launcher cycle: last rank's start to the cycle's last event.
    up = 0.0
    for cycle in sorted({k[0] for k in order}):
        ces = [e for k in order if k[0] == cycle for e in epochs[k]]
        starts = [float(e["t"]) for e in ces if e["kind"] == "start"]
        begin = max(starts) if starts else float(ces[0]["t"])
        up += max(0.0, float(ces[-1]["t"]) - begin)

    recoveries = [_recovery(epochs[a], epochs[b], a, b, ref_steps[a], t0) for a, b in zip(order, order[1:])]

    # Durable checkpoints (step, time) and freshness at every reference step.
    durable: dict[int, float] = {}
    for e in evs:
        if e["kind"] == "ckpt_persist":
            step = int(e["step"])
            durable[step] = max(durable.get(step, 0.0), float(e["t"]))
    persisted = sorted((t, s) for s, t in durable.items())
    kept_set = {(t, s) for t, s, _ in kept}
    series: list[Sample] = []
    cum = 0.0
    j = 0
    latest: tuple[float, int] | None = None
    all_ref = sorted((t, s, c) for key in order for t, s, c in ref_steps[key])
    for t, step, compute in all_ref:
        while j < len(persisted) and persisted[j][0] <= t:
            latest = persisted[j]  # the newest by time: after a rollback that is the one a restart loads
            j += 1
        is_kept = (t, step) in kept_set
        if is_kept:
            cum += mean_step if compute is None else compute
        age_steps = step - (latest[1] if latest else 0)
        age_s = t - (latest[0] if latest else t0)
        series.append(Sample(t - t0, step, cum / max(t - t0, 1e-9), age_steps, age_s, is_kept))
    ages_steps = [float(s.age_steps) for s in series]
    ages_s = [s.age_s for s in series]
    freshness = {
        "mean_age_steps": sum(ages_steps) / len(ages_steps) if ages_steps else None,
        "max_age_steps": max(ages_steps) if ages_steps else None,
        "mean_age_s": sum(ages_s) / len(ages_s) if ages_s else None,
        "max_age_s": max(ages_s) if ages_s else None,
    }

    causes = Counter(f"{r.layer}: {r.cause}" for r in recoveries)
    calibration = _calibrate(evs, ref, samples, recoveries, plan, wall)
    timeline = [
        {"t": round(float(e["t"]) - t0, 6), "rank": int(e.get("rank", 0)), "cycle": _key(e)[0],
         "iteration": _key(e)[1], "kind": e["kind"],
         **{k: v for k, v in e.items() if k in ("step", "cause", "layer", "status", "seconds", "reason", "injected")}}
        for e in evs if e["kind"] not in ("step", "ckpt_stall")
    ]
    totals = [r.total for r in recoveries if r.total is not None]
    return RunAnalysis(
        wall_s=wall,
        training_goodput=productive / wall,
        infrastructure_goodput=up / wall,
        productive_s=productive,
        up_s=up,
        kept_steps=len(kept),
        steps_run=steps_run,
        final_step=max((s for _, s, _ in all_ref), default=0),
        recoveries=recoveries,
        recovery_stats={
            "total": _stats(totals),
            "detection": _stats([r.detection for r in recoveries if r.total is not None]),
            "restart": _stats([r.restart for r in recoveries if r.total is not None]),
            "load": _stats([r.load for r in recoveries if r.total is not None]),
            "first_step": _stats([r.first_step for r in recoveries if r.first_step is not None]),
        },
        rollback_stats=_stats([float(r.rollback_steps) for r in recoveries]),
        freshness=freshness,
        causes=dict(causes),
        checkpoints=len(durable),
        calibration=calibration,
        timeline=timeline,
        series=series,
        ranks=ranks,
        t0=t0,
    )


def _recovery(old: list[Event], new: list[Event], a: EpochKey, b: EpochKey,
              old_ref_steps: list[tuple[float, int, float | None]], t0: float) -> Recovery:
    layer = "launcher" if b[0] != a[0] else "inprocess"
    cause, rank, injected, t_fault = _cause([e for e in old if e["kind"] == "fault"])
    steps_old = [e for e in old if e["kind"] == "step"]
    last_step = max((int(e["step"]) for e in steps_old), default=0)
    if t_fault is None:
        t_fault = float(steps_old[-1]["t"]) if steps_old else float(old[-1]["t"])
    if layer == "launcher":
        stops = [float(e["t"]) for e in old if float(e["t"]) >= t_fault and e["rank"] != rank
                 and ((e["kind"] == "fault" and e.get("cause") == "sigterm") or e["kind"] == "end")]
        t_detect = min(stops) if stops else max(t_fault, float(old[-1]["t"]))
        marks = [float(e["t"]) for e in new if e["kind"] == "start"]
    else:
        marks = [float(e["t"]) for e in new if e["kind"] == "restart"]
        t_detect = min(marks) if marks else float(new[0]["t"])
    t_restarted = max(marks) if marks else t_detect
    resumes = [e for e in new if e["kind"] == "resume"]
    t_loaded = max([float(e["t"]) for e in resumes] + [t_restarted])
    first_steps: dict[int, float] = {}
    for e in new:
        if e["kind"] == "step" and int(e["rank"]) not in first_steps:
            first_steps[int(e["rank"])] = float(e["t"])
    t_first = max(first_steps.values()) if first_steps else None
    if resumes:
        resumed = min(int(e["step"]) for e in resumes)
    else:
        new_steps = [int(e["step"]) for e in new if e["kind"] == "step"]
        resumed = min(new_steps) - 1 if new_steps else 0
    del old_ref_steps  # the rollback counts any rank's progress, not just the reference rank's
    return Recovery(
        layer=layer, cause=cause, rank=rank, t_fault=t_fault - t0,
        detection=max(0.0, t_detect - t_fault),
        restart=max(0.0, t_restarted - t_detect),
        load=max(0.0, t_loaded - t_restarted),
        first_step=None if t_first is None else max(0.0, t_first - t_loaded),
        total=None if t_first is None else t_first - t_fault,
        last_step=last_step, resumed_step=resumed, rollback_steps=max(0, last_step - resumed),
        injected=injected,
    )


def _after_first_per_epoch(events: list[Event]) -> list[Event]:
    """Drop each epoch's first event of the list, unless that would leave nothing."""
    seen: set[EpochKey] = set()
    rest = []
    for e in events:
        if _key(e) in seen:
            rest.append(e)
        seen.add(_key(e))
    return rest or events


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(a: float, b: float, spans: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in spans if x < b and y > a)


MIN_INTERFERENCE_SAMPLES = 3


def _interference(evs: list[Event], ref: int) -> tuple[float | None, float | None, int, int]:
    """(c_0, c_w, idle steps, writing steps) of the reference rank; see the module docstring."""
    writes = _merge([(float(e["t"]) - float(e.get("seconds", 0.0)), float(e["t"]))
                     for e in evs if e["kind"] == "ckpt_persist" and float(e.get("seconds", 0.0)) > 0])
    steps: list[tuple[float, float]] = []  # (compute, of which inside a write window)
    prev: dict[EpochKey, float | None] = {}
    stalls: list[tuple[float, float]] = []
    for e in evs:
        if int(e.get("rank", 0)) != ref:
            continue
        key, kind, t = _key(e), e["kind"], float(e["t"])
        if kind in ("start", "resume", "restart"):
            prev[key], stalls = None, []
        elif kind == "ckpt_stall":
            stalls.append((t - float(e.get("seconds", 0.0)), t))
        elif kind == "step":
            t_prev = prev.get(key)
            if t_prev is not None and t > t_prev:
                pieces, a = [], t_prev
                for x, y in _merge(stalls):
                    if x > a:
                        pieces.append((a, min(x, t)))
                    a = max(a, y)
                if a < t:
                    pieces.append((a, t))
                compute = sum(y - x for x, y in pieces)
                if compute > 0:
                    steps.append((compute, sum(_overlap(x, y, writes) for x, y in pieces)))
            prev[key], stalls = t, []
    idle = [c for c, o in steps if o <= 0.01 * c]
    busy = [(c, o) for c, o in steps if o > 0.01 * c]
    if len(idle) < MIN_INTERFERENCE_SAMPLES:
        return None, None, len(idle), len(busy)
    c0 = sum(idle) / len(idle)
    work = sum(1.0 - (c - o) / c0 for c, o in busy)
    if len(busy) < MIN_INTERFERENCE_SAMPLES or work <= 0:
        return c0, None, len(idle), len(busy)
    return c0, sum(o for _, o in busy) / work, len(idle), len(busy)


def _calibrate(evs: list[Event], ref: int, samples: list[float], recoveries: list[Recovery],
               plan: Mapping[str, Any] | None, wall: float) -> Calibration:
    stalls = [e for e in evs if e["kind"] == "ckpt_stall" and int(e.get("rank", 0)) == ref]
    # The first save of a process also allocates and pins its staging arena (measured: 15 ms mean
    # over 8 saves where the steady state was ~4 ms, 101 MB on an H200); the model wants steady state.
    steady = _after_first_per_epoch(stalls)
    blocked = [max(0.0, float(e.get("seconds", 0.0)) - float(e.get("waited", 0.0))) for e in steady]
    waited = [float(e.get("waited", 0.0)) for e in stalls]
    persists = [e for e in evs if e["kind"] == "ckpt_persist"]
    # Steady state of the write too: once a pruned checkpoint's files are recycled, a write overwrites
    # them in place; the first keep_last + 1 writes of a process allocate new files (measured on the
    # H200's discard-mounted ext4: ~61 ms recycled against 75-93 ms fresh, 101 MB), which would
    # weigh 2 of the 8 saves of a short calibration run.
    if any(e.get("recycled") for e in persists):
        persists = [e for e in persists if e.get("recycled")]
    per_step: dict[tuple[EpochKey, int], tuple[float, float]] = {}
    for e in persists:
        k = (_key(e), int(e["step"]))
        sec, size = per_step.get(k, (0.0, 0.0))
        per_step[k] = (max(sec, float(e.get("seconds", 0.0))), size + float(e.get("bytes", 0.0)))
    writes = [v[0] for v in per_step.values()]
    sizes = [v[1] for v in per_step.values()]
    interval: int | None = None
    async_: bool | None = None
    section = ((plan or {}).get("profile") or {}).get("checkpoint") if plan else None
    if isinstance(section, Mapping):
        if isinstance(section.get("interval_steps"), int):
            interval = int(section["interval_steps"])
        if isinstance(section.get("async"), bool):
            async_ = bool(section["async"])
    if interval is None:
        saved = sorted({int(e["step"]) for e in stalls})
        gaps = Counter(b - a for a, b in zip(saved, saved[1:]) if b > a)
        if gaps:
            interval = gaps.most_common(1)[0][0]
    totals = [r.total for r in recoveries if r.total is not None]
    c0, cw, n_idle, n_busy = _interference(evs, ref)
    return Calibration(
        step_time=sum(samples) / len(samples) if samples else 0.0,
        step_time_p50=percentile(samples, 50) or 0.0,
        step_samples=len(samples),
        stall=sum(blocked) / len(blocked) if blocked else None,
        waited=sum(waited) / len(waited) if waited else None,
        write=sum(writes) / len(writes) if writes else None,
        write_bytes=sum(sizes) / len(sizes) if sizes else None,
        saves=len(stalls),
        interval_steps=interval,
        async_=async_,
        restart=sum(totals) / len(totals) if totals else None,
        unplanned_faults=sum(1 for r in recoveries if not r.injected),
        wall_s=wall,
        step_time_idle=c0,
        step_time_writing=cw,
        write_slowdown=cw / c0 if cw is not None and c0 else None,
        idle_samples=n_idle,
        writing_samples=n_busy,
    )
