"""How often to checkpoint: Young/Daly on the blocking cost, plus async back-pressure.

Symbols (seconds unless said otherwise):

- `t`  compute time of one optimizer step (no checkpoint in it)
- `n`  checkpoint interval in steps; `tau = n * t` is the compute between two saves
- `s`  stall: time one save blocks the training loop (async: staging the state; sync: `s + W`)
- `W`  write: time from staged to durable (async: runs in the background)
- `R`  restart cost: fault to the first step after recovery (detection, restart, load, first step)
- `M`  mean time between failures of the *job* (per-node MTBF / nodes)
- `k`  write slowdown `c_w / c_0`: a step's compute while a background write runs (`c_w`) over
       the same step with no write running (`c_0 = t`); 1 when the write does not compete

**Steady state (no failures).** A sync save blocks `delta = s + W`, so one cycle lasts
`P = tau + delta`. An async save blocks `s`; its write then runs in the background for `W`,
and the steps it overlaps take `c_w = k t` instead of `t` (on a CPU host the writer threads take
cores from training). The next save cannot start before the previous write is durable (one
staging arena, one write in flight). With `n c_w >= W` the write ends inside the interval after
`m = W / c_w` steps and the other `n - m` run at full speed:

    P = s + W + (n - m) t = s + tau + W (1 - 1/k)            efficiency = tau / P

With `n c_w < W` the job is in the *back-pressure* regime: every step overlaps a write and each
save waits `w = W - n c_w` for the last one, so `P = s + W` and the efficiency is `tau / (W + s)`
whatever async promised. With `k = 1` both reduce to `P = max(tau, W) + s`.

**Work lost per failure.** A failure at a uniformly random moment of a cycle loses the steps
since the newest *durable* checkpoint. Integrating over the cycle (the async write of save k is
not durable until `s + W` after it started, and in back-pressure save k-1 is not durable until
the wait ends):

    sync:                    E[steps lost] = n * (delta + tau/2) / P
    async, n c_w >= W:       E[steps lost] = (n (s + W) + m W / 2 + t (n^2 - m^2) / 2) / P
    async, back-pressure:    E[steps lost] = n * (2w + s + 3 n c_w / 2) / P

(with `k = 1`: `n * (2w + s + tau/2 + min(W, tau)) / P`)

and redoing them costs `L = E[steps lost] * P / n` of wall time.

**Goodput (first order in 1/M).** Each failure wastes `R + L`; failures come every `M`:

    goodput = efficiency * max(0, 1 - (R + L) / M)

**Optimum.** Daly's higher-order optimum on the blocking cost `delta_b` (async: `s + W (1 - 1/k)`,
the stall plus the time the write's interference adds; sync: `s + W`)

    tau_opt = sqrt(2 delta_b M) * (1 + sqrt(delta_b / 2M) / 3 + (delta_b / 2M) / 9) - delta_b   (delta_b < 2M)
    tau_opt = M                                                                              (otherwise)

(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 22, 2006; Young's first-order `sqrt(2 delta M)` is its leading term). Async adds the
constraint `n c_w >= headroom * W` (`tau >= headroom * W / k`): below `W` every save waits (efficiency falls as `tau / W`, and
more steps are lost per failure), so the optimum is never below `W`; the headroom (default 1.2)
keeps a margin for write-time jitter and for a write that runs slower while training competes
for host memory, PCIe and network. AWS measured exactly that edge: 100 steps were ~280 s of
compute against a ~275 s write, and async reached only 29.6 % efficiency.

Limits: failures are exponential and independent; P, R and L are small against M (first-order
goodput); a failure loses an async write still in flight; step time, stall and write time are
constant (calibrate them from a run under the same load); the slowdown `k` is one number for
every step a write overlaps, and `W` does not depend on the interval (in back-pressure training
waits and the writer gets the whole host, so a CPU write can run faster than calibrated; the
calibration takes the steady-state write, see `resctl.telemetry.goodput`); the restart cost does
not depend on the interval.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Mode = Literal["async", "sync"]
Regime = Literal["ok", "no-headroom", "back-pressure"]

DEFAULT_HEADROOM = 1.2


def young_interval(delta: float, mtbf: float) -> float:
    """Young's first-order optimum compute time between checkpoints: sqrt(2 * delta * M)."""
    _check_positive(delta=delta, mtbf=mtbf)
    return math.sqrt(2.0 * delta * mtbf)


def daly_interval(delta: float, mtbf: float) -> float:
    """Daly's higher-order optimum compute time between checkpoints (FGCS 2006, eq. 37).

    `delta` is the time one checkpoint blocks the computation, `mtbf` the mean time between
    failures, both in seconds. Daly's examples: delta = 5 min, M = 24 h -> 116.7 min;
    M = 6 h -> 56.7 min.
    """
    _check_positive(delta=delta, mtbf=mtbf)
    if math.isinf(mtbf):
        return math.inf
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


@dataclass(frozen=True)
class Costs:
    """What one job's checkpoints and failures cost, in seconds (see the module docstring)."""

    step_time: float
    stall: float
    write: float
    restart: float = 0.0
    mtbf: float = math.inf
    headroom: float = DEFAULT_HEADROOM
    # k = c_w / c_0: a step's compute while a background write runs over `step_time` (c_0, no
    # write running). 1.0: the write does not compete with training (GPU compute, idle host).
    write_slowdown: float = 1.0

    def __post_init__(self) -> None:
        if not self.step_time > 0:
            raise ValueError(f"step time must be > 0 seconds, got {self.step_time!r}")
        for name in ("stall", "write", "restart"):
            value = getattr(self, name)
            if not value >= 0 or math.isinf(value):
                raise ValueError(f"{name} must be a finite number >= 0 seconds, got {value!r}")
        if not self.mtbf > 0:
            raise ValueError(f"MTBF must be > 0 seconds, got {self.mtbf!r}")
        if not self.headroom >= 1.0:
            raise ValueError(f"headroom must be >= 1.0, got {self.headroom!r}")
        if not 1.0 <= self.write_slowdown < math.inf:
            raise ValueError(f"write slowdown must be a finite number >= 1.0, got {self.write_slowdown!r}")

    @property
    def write_step_time(self) -> float:
        """c_w: compute of one step while a background write runs."""
        return self.step_time * self.write_slowdown

    def interference(self) -> float:
        """Seconds one async write adds to a cycle by slowing the steps it overlaps: W (1 - 1/k)."""
        return self.write * (1.0 - 1.0 / self.write_slowdown)

    def blocking(self, mode: Mode) -> float:
        """Seconds one save costs when it does not wait for an earlier one (async: the stall plus
        the interference of its write; sync: stall plus write)."""
        return self.stall + self.interference() if mode == "async" else self.stall + self.write


@dataclass(frozen=True)
class Prediction:
    """The model's account of one interval and mode."""

    interval_steps: int
    mode: Mode
    compute_s: float  # tau: compute between saves
    cycle_s: float  # P: wall time from one save to the next
    wait_s: float  # async back-pressure wait per save
    efficiency: float  # tau / P, no failures
    steps_lost: float  # expected steps redone per failure
    work_lost_s: float  # steps_lost * step time (compute redone per failure)
    wasted_per_failure_s: float  # R + L: restart plus wall time to redo the lost steps
    goodput: float  # efficiency * (1 - (R + L) / M)
    regime: Regime

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def evaluate(interval_steps: int, costs: Costs, mode: Mode = "async") -> Prediction:
    """Predict efficiency, loss per failure and goodput of saving every `interval_steps` steps."""
    if interval_steps < 1:
        raise ValueError(f"interval must be >= 1 step, got {interval_steps}")
    n = interval_steps
    tau = n * costs.step_time
    s, W = costs.stall, costs.write
    if mode == "async":
        c0, cw = costs.step_time, costs.write_step_time
        tau_w = n * cw  # the interval's compute if a write ran through all of it
        if tau_w >= W:  # the write ends inside the interval: W / c_w steps at c_w, the rest at c_0
            wait = 0.0
            m = W / cw
            cycle = s + tau + costs.interference()  # = s + W + (n - m) c_0
            # Integral over the cycle of the steps since the newest durable save (module docstring).
            steps_lost = (n * (s + W) + m * W / 2.0 + c0 * (n * n - m * m) / 2.0) / cycle
        else:  # back-pressure: every step overlaps a write, and the save waits for the rest of it
            wait = W - tau_w
            cycle = s + W
            steps_lost = n * (2.0 * wait + s + 1.5 * tau_w) / cycle
        regime: Regime = "back-pressure" if tau_w < W else ("no-headroom" if tau_w < costs.headroom * W else "ok")
    else:
        wait = 0.0
        delta = s + W
        cycle = tau + delta
        steps_lost = n * (delta + tau / 2.0) / cycle
        regime = "ok"
    efficiency = tau / cycle
    wasted = costs.restart + steps_lost * cycle / n
    goodput = efficiency * max(0.0, 1.0 - wasted / costs.mtbf)
    return Prediction(n, mode, tau, cycle, wait, efficiency, steps_lost, steps_lost * costs.step_time,
                      wasted, goodput, regime)


@dataclass(frozen=True)
class Alternative:
    """One row of the alternatives table."""

    label: str
    prediction: Prediction

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, **self.prediction.to_json()}


@dataclass(frozen=True)
class Recommendation:
    """The recommended interval, why, and what the other choices would give."""

    costs: Costs
    mode: Mode
    interval_steps: int
    daly_compute_s: float  # unconstrained Daly optimum on the blocking cost
    min_compute_s: float  # async: headroom * W / k, compute at c_0 (0 for sync)
    bound: Literal["daly", "back-pressure"]
    prediction: Prediction
    current: Prediction | None
    alternatives: list[Alternative] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "costs": asdict(self.costs),
            "mode": self.mode,
            "interval_steps": self.interval_steps,
            "daly_compute_s": self.daly_compute_s,
            "min_compute_s": self.min_compute_s,
            "bound": self.bound,
            "prediction": self.prediction.to_json(),
            "current": self.current.to_json() if self.current else None,
            "alternatives": [a.to_json() for a in self.alternatives],
            "warnings": self.warnings,
        }


def optimum_steps(costs: Costs, mode: Mode) -> tuple[int, float, float, Literal["daly", "back-pressure"]]:
    """(interval in steps, Daly compute, minimum compute, which bound decided)."""
    if math.isinf(costs.mtbf):
        raise ValueError("without a failure rate every interval longer than the write is optimal; give an MTBF")
    daly = daly_interval(costs.blocking(mode), costs.mtbf) if costs.blocking(mode) > 0 else 0.0
    # Async floor in compute at c_0: n c_w >= headroom W.
    floor = costs.headroom * costs.write / costs.write_slowdown if mode == "async" else 0.0
    tau = max(daly, floor)
    bound: Literal["daly", "back-pressure"] = "back-pressure" if floor > daly else "daly"
    n = max(1, math.ceil(tau / costs.step_time - 1e-9))
    if bound == "daly" and n > 1:
        # Daly's tau is continuous; of the two whole intervals around it keep the better one that
        # still satisfies the back-pressure floor.
        lower = n - 1
        if lower * costs.step_time >= floor and evaluate(lower, costs, mode).goodput > evaluate(n, costs, mode).goodput:
            n = lower
    return n, daly, floor, bound


def _nice(x: float) -> int:
    """Round to two significant digits (at least 1): 117 -> 120, 2345 -> 2300."""
    if x < 1:
        return 1
    digits = max(0, int(math.floor(math.log10(x))) - 1)
    return max(1, int(round(x / 10**digits) * 10**digits))


def recommend(costs: Costs, current: int | None = None, mode: Mode = "async") -> Recommendation:
    """The interval that maximises expected goodput, the prediction there, and alternatives.

    `current` is the interval the job uses now (it is evaluated, and warned about in the
    back-pressure or no-headroom regime); `mode` is how the job saves (async or sync).
    """
    n, daly, floor, bound = optimum_steps(costs, mode)
    best = evaluate(n, costs, mode)
    other: Mode = "sync" if mode == "async" else "async"
    n_other = optimum_steps(costs, other)[0]
    rows: list[Alternative] = [Alternative("recommended", best)]
    rows.append(Alternative(f"best {other}", evaluate(n_other, costs, other)))
    cur = None
    if current is not None:
        cur = evaluate(current, costs, mode)
        rows.append(Alternative("current", cur))
        rows.append(Alternative(f"current {other}", evaluate(current, costs, other)))
    seen = {(a.prediction.interval_steps, a.prediction.mode) for a in rows}
    candidates = {_nice(n * f) for f in (0.25, 0.5, 2.0, 4.0)}
    if costs.write > 0:
        candidates.add(max(1, math.ceil(costs.write / costs.write_step_time - 1e-9)))  # the back-pressure edge
    for c in sorted(candidates):
        if (c, mode) not in seen:
            rows.append(Alternative("", evaluate(c, costs, mode)))
            seen.add((c, mode))
    head, tail = rows[:4 if current is not None else 2], rows[4 if current is not None else 2:]
    rows = head + sorted(tail, key=lambda a: a.prediction.interval_steps)

    warnings: list[str] = []
    if cur is not None and mode == "async" and cur.regime != "ok":
        need = math.ceil(costs.headroom * costs.write / costs.write_step_time - 1e-9)
        compute = f"{current} steps = {cur.compute_s:.4g} s of compute"
        if costs.write_slowdown != 1.0:
            compute += f", {cur.interval_steps * costs.write_step_time:.4g} s while a write runs"
        if cur.regime == "back-pressure":
            warnings.append(
                f"back-pressure: the current interval ({compute}) is shorter "
                f"than one checkpoint write ({costs.write:.4g} s), so every save waits {cur.wait_s:.4g} s for the "
                f"previous one and async cannot hide the write (predicted efficiency {cur.efficiency:.1%}); "
                f"use at least {need} steps")
        else:
            warnings.append(
                f"no headroom: the current interval ({compute}) is within "
                f"{costs.headroom:g}x of one checkpoint write ({costs.write:.4g} s); a slightly slower write puts "
                f"every save into back-pressure and async cannot hide it; use at least {need} steps")
    if best.goodput <= 0.0:
        warnings.append("the job fails faster than it can make progress: restart cost plus lost work exceed the MTBF")
    return Recommendation(costs, mode, n, daly, floor, bound, best, cur, rows, warnings)


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value!r}")
