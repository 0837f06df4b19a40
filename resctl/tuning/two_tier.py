"""Two-tier plan: how often to snapshot into host memory and how often to write to disk.

With the memory tier (`checkpoint.memory_every = m`) the two intervals answer to different faults:

- A **process fault** (an exception, a SIGKILL, a hang, a GPU error that a restart clears) keeps
  the node and its shared memory: the job resumes from the newest memory snapshot. The memory
  interval is Daly's optimum on the time a snapshot blocks training (`s_m`, the copy out of the
  state) against the MTBF of such faults, and never below `headroom x C` of compute, `C` being the
  snapshot's background commit (checksum and manifest; with device staging also the
  device-to-host copy): a commit longer than the m - 1 steps between a snapshot and the step that
  ends in the next one holds that step (the memory tier's back-pressure, counted in the overhead).
- A **node fault** (the host is lost, or its memory with it) falls back to disk. The disk interval
  is the single-tier recommendation (`model.recommend`) on the disk costs against the MTBF of node
  faults alone, rounded up to a multiple of the memory interval: the engine writes a disk
  checkpoint from the memory snapshot of the same step (`Checkpointer.maybe_save`), so one copy out
  of the state serves both tiers; at a step that is not a snapshot step it copies the state again.

**Overhead** (no faults) of a plan `(m, n)`, `n = j m`: one disk cycle of `n` steps lasts the
single-tier async cycle `P_d(n)` (`model.evaluate`: compute, the disk save's stall, the write's
interference or back-pressure wait) plus `j (s_m + h)` for the snapshots (`h`, the commit's
back-pressure hold, is `max(0, C - (m - 1) t)`: the step ending in the next snapshot waits for a
commit still in flight; `s_m + h` is a snapshot's true cost, what a run's `ckpt_mem` records) plus
the slot wait: a disk write reads its snapshot's slot for `W`, and the snapshot two after it needs that slot again, so it waits
`max(0, W - 2 m c_w)` (less what back-pressure already counted). `overhead = 1 - n t / cycle`.
It never increases with `n` (for a fixed `m`) nor with `m` (for a fixed `n`).

**Budget.** `plan` keeps the overhead within `max_overhead`. The preferred memory interval
(Daly, or the commit floor) is kept when some disk interval fits with it, and the disk interval is
then the smallest multiple of it at or above the disk recommendation that fits. Otherwise the
first memory interval that fits is looked for upwards, then downwards to the commit floor, and of
it and the next `REFINE` the one with the least expected waste (overhead plus work lost per second
to both kinds of faults) wins. Intervals are capped at the MTBF they answer to (an interval longer
than the mean time between faults is not a plan); when nothing within the caps fits, the
preferred plan is returned with `feasible = False` and a warning.

**Work lost per fault.** Process fault: half a memory interval plus `C` (a fault during a commit
falls back one snapshot). Node fault: `model.evaluate`'s steps lost for the disk interval.

Pure math, no I/O; `resctl tune-interval` feeds it from a run's `ckpt_mem`, `ckpt_stall` and
`ckpt_persist` events or from flags.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from itertools import chain, islice
from typing import Any

from resctl.tuning.model import Costs, Mode, daly_interval, evaluate, recommend

MAX_SCAN = 200_000  # memory intervals tried at most before a plan is declared out of budget
REFINE = 256  # memory intervals after the first that fits, compared for the least expected waste
DEFAULT_MAX_OVERHEAD = 0.01


@dataclass(frozen=True)
class MemoryCosts:
    """What one memory snapshot costs, in seconds."""

    stall: float  # s_m: the training loop is blocked (the copy out of the state), waits excluded
    commit: float = 0.0  # C: staged to committed, in the background

    def __post_init__(self) -> None:
        for name in ("stall", "commit"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"memory snapshot {name} must be a finite number >= 0 seconds, got {value!r}")


@dataclass(frozen=True)
class TwoTierPlan:
    memory_every: int  # steps between memory snapshots
    interval_steps: int  # steps between disk checkpoints (a multiple of memory_every)
    memory_rule: str  # daly | commit | budget | disk-source (no process faults: one snapshot per disk write) | given
    disk_rule: str  # daly | back-pressure (single-tier bound) | multiple | budget | mtbf (capped) | given
    overhead: float  # fraction of fault-free wall time not training (both tiers)
    overhead_memory: float  # of which the snapshots' stalls
    max_overhead: float
    feasible: bool  # overhead <= max_overhead
    steps_lost_process: float  # expected steps redone after a process fault (restored from memory)
    loss_process_s: float  # the same in compute seconds
    steps_lost_node: float  # expected steps redone after a node fault (restored from disk)
    loss_node_s: float
    process_mtbf: float  # job-level MTBF of faults the memory tier recovers (inf: none)
    node_mtbf: float  # job-level MTBF of faults only the disk recovers
    disk_only_interval: int  # the single-tier recommendation against node faults (before rounding)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["process_mtbf"] = None if math.isinf(self.process_mtbf) else self.process_mtbf
        return doc


def overhead(m: int, n: int, memory: MemoryCosts, disk: Costs, mode: Mode = "async") -> tuple[float, float]:
    """(overhead, memory part) of snapshots every `m` steps and disk writes every `n` (module docstring)."""
    if m < 1 or n < m or n % m:
        raise ValueError(f"need 1 <= memory_every <= interval_steps and a multiple of it, got {m}, {n}")
    d = evaluate(n, disk, mode)
    j = n // m
    wait = 0.0
    if mode == "async" and j >= 2:  # the snapshot two after a disk write waits for it to read the slot
        cw = disk.write_step_time
        wait = max(0.0, disk.write - 2 * m * cw) - max(0.0, disk.write - n * cw)
    per_snapshot = memory.stall + hold(m, memory, disk.step_time)
    cycle = d.cycle_s + j * per_snapshot + wait
    return 1.0 - n * disk.step_time / cycle, j * per_snapshot / cycle


def hold(m: int, memory: MemoryCosts, step_time: float) -> float:
    """Seconds the step ending in the next snapshot waits for a commit still in flight (the
    memory tier's back-pressure): the commit overlaps the m - 1 steps in between for free."""
    return max(0.0, memory.commit - (m - 1) * step_time)


def plan(memory: MemoryCosts, disk: Costs, *, process_mtbf: float, node_mtbf: float, mode: Mode = "async",
         max_overhead: float = DEFAULT_MAX_OVERHEAD) -> TwoTierPlan:
    """The two intervals (see the module docstring). `disk.mtbf` is replaced by `node_mtbf`; a
    `process_mtbf` of inf means the memory tier recovers no fault (it only feeds the disk writes)."""
    if not process_mtbf > 0:
        raise ValueError(f"process MTBF must be > 0 seconds (inf: no process faults), got {process_mtbf!r}")
    if not (node_mtbf > 0 and math.isfinite(node_mtbf)):
        raise ValueError(f"node MTBF must be a finite number > 0 seconds, got {node_mtbf!r}")
    if not 0 < max_overhead < 1:
        raise ValueError(f"max overhead must be a fraction between 0 and 1 (e.g. 0.01), got {max_overhead!r}")
    t = disk.step_time
    costs = replace(disk, mtbf=node_mtbf)
    rec = recommend(costs, mode=mode)
    n0 = rec.interval_steps
    commit_floor = max(1, math.ceil(costs.headroom * memory.commit / t - 1e-9))
    n_cap = max(n0, int(node_mtbf // t), commit_floor)
    m_cap = n_cap if math.isinf(process_mtbf) else max(commit_floor, min(n_cap, int(process_mtbf // t)))
    if math.isinf(process_mtbf):
        m0, rule = max(commit_floor, n0), "disk-source"
    else:
        daly = daly_interval(memory.stall, process_mtbf) if memory.stall > 0 else 0.0
        m_daly = max(1, math.ceil(daly / t - 1e-9))
        m0, rule = max(m_daly, commit_floor), ("commit" if commit_floor > m_daly else "daly")
    m0 = min(m0, m_cap)

    found = _search(m0, commit_floor, m_cap, n0, n_cap, memory, costs, mode, max_overhead, process_mtbf)
    warnings: list[str] = []
    if found is None:
        m, n = m0, min(n_cap, math.ceil(n0 / m0) * m0) // m0 * m0
        best, _ = overhead(m_cap, n_cap // m_cap * m_cap, memory, costs, mode)
        warnings.append(f"no plan keeps the overhead within {max_overhead:.2%} with intervals shorter than the MTBF "
                        f"(the least, snapshots every {m_cap} steps, costs {best:.2%}); showing the plan Daly prefers")
    else:
        m, n = found
        if m != m0:
            rule = "budget"
    rounded = math.ceil(n0 / m) * m
    disk_rule = rec.bound if n == n0 else ("mtbf" if n < n0 else "multiple" if n == rounded else "budget")
    return assess(m, n, memory, costs, process_mtbf=process_mtbf, mode=mode, max_overhead=max_overhead,
                  rules=(rule, disk_rule), disk_only=n0, warnings=warnings)


def assess(m: int, n: int, memory: MemoryCosts, disk: Costs, *, process_mtbf: float, mode: Mode = "async",
           max_overhead: float = DEFAULT_MAX_OVERHEAD, rules: tuple[str, str] = ("given", "given"),
           disk_only: int | None = None, warnings: list[str] | None = None) -> TwoTierPlan:
    """Overhead and work lost per fault of snapshots every `m` steps and disk writes every `n` (a
    multiple of `m`), node faults every `disk.mtbf` (`plan`'s result, or a job's current settings)."""
    t = disk.step_time
    over, over_mem = overhead(m, n, memory, disk, mode)
    node = evaluate(n, disk, mode)
    lost_p = node.steps_lost if math.isinf(process_mtbf) else m / 2.0 + memory.commit / t
    return TwoTierPlan(
        memory_every=m, interval_steps=n, memory_rule=rules[0], disk_rule=rules[1], overhead=over,
        overhead_memory=over_mem, max_overhead=max_overhead, feasible=over <= max_overhead,
        steps_lost_process=lost_p, loss_process_s=lost_p * t, steps_lost_node=node.steps_lost,
        loss_node_s=node.work_lost_s, process_mtbf=process_mtbf, node_mtbf=disk.mtbf,
        disk_only_interval=n if disk_only is None else disk_only, warnings=warnings or [],
    )


def _search(m0: int, m_min: int, m_cap: int, n0: int, n_cap: int, memory: MemoryCosts, disk: Costs, mode: Mode,
            budget: float, process_mtbf: float) -> tuple[int, int] | None:
    """(m, n) within the budget, or None when none fits. The first m that fits is looked for from m0
    up to m_cap, then down to m_min; for each m the smallest multiple n >= n0 that fits (or the
    largest <= n_cap). m0 itself is kept when it fits; otherwise, of the first m that fits and the
    next `REFINE`, the one losing the least to faults and overhead wins (a slightly longer memory
    interval can allow a much shorter disk one)."""
    t = disk.step_time
    beta = budget / (1.0 - budget)  # the budget as non-compute time over compute time
    disk_floor = evaluate(n_cap, disk, mode).cycle_s / (n_cap * t) - 1.0  # the least disk part: at n_cap
    room = beta - disk_floor
    if room < 0 or (memory.stall > 0 and room == 0):
        return None
    # Any feasible m has s_m / (m t) <= beta - disk_floor.
    m_lb = m_min if memory.stall == 0 else max(m_min, math.ceil(memory.stall / (t * room) - 1e-9))
    order = chain(range(max(m0, m_lb), m_cap + 1), range(min(m0, m_cap + 1) - 1, m_lb - 1, -1))
    first = next((m for m in islice(order, MAX_SCAN) if _fits(m, n_cap // m, memory, disk, mode, budget)), None)
    if first is None:
        return None
    if first == m0:  # the preferred memory interval fits: keep it, with the smallest disk interval that fits
        return m0, _smallest_n(m0, n0, n_cap, memory, disk, mode, budget)
    best: tuple[float, int, int] | None = None
    for m in range(first, min(m_cap, first + REFINE) + 1):
        if not _fits(m, n_cap // m, memory, disk, mode, budget):
            continue
        n = _smallest_n(m, n0, n_cap, memory, disk, mode, budget)
        over = overhead(m, n, memory, disk, mode)[0]
        lost_p = 0.0 if math.isinf(process_mtbf) else (m * t / 2 + memory.commit) / process_mtbf
        waste = over + lost_p + evaluate(n, disk, mode).work_lost_s / disk.mtbf
        if best is None or waste < best[0]:
            best = (waste, m, n)
    return None if best is None else (best[1], best[2])


def _smallest_n(m: int, n0: int, n_cap: int, memory: MemoryCosts, disk: Costs, mode: Mode, budget: float) -> int:
    """The smallest multiple of m >= n0 that fits (the largest <= n_cap fits; overhead never increases with n)."""
    top = n_cap // m
    lo, hi = min(max(1, math.ceil(n0 / m)), top), top
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _fits(m, mid, memory, disk, mode, budget) else (mid + 1, hi)
    return hi * m


def _fits(m: int, j: int, memory: MemoryCosts, disk: Costs, mode: Mode, budget: float) -> bool:
    return overhead(m, j * m, memory, disk, mode)[0] <= budget
