"""The report's tables as rows of text: one wording for each number.

`resctl report` (cli/report_cmd.py, rich tables) and `resctl report --html` (report_html.py) both
render these rows, so the terminal and the page cannot disagree on a phase, its label or its
rounding. The phases themselves are defined in `resctl.telemetry.goodput` (RECOVERY_PHASES).
"""

from __future__ import annotations

from typing import Any

from resctl.telemetry.goodput import RECOVERY_PHASES, RECOVERY_STATS, Recovery, RunAnalysis

#: Heading of the per-fault phases table (first column: the fault's number in the faults table).
PHASE_HEAD: tuple[str, ...] = ("#", *(label for _, label in RECOVERY_PHASES))
STATS_HEAD = ("recovery (s)", "p50", "p95", "max")
#: What a "-" in the phases table means (goodput's module docstring has the definitions).
PHASES_NOTE = ("stop + rendezvous + start workers = restart; -: not a phase of that recovery (in-process: "
               "no stop or start) or not recorded (a run without `spawned`: the rendezvous includes the start)")
#: The fields of an event shown as its detail (timeline tables, plot hover texts).
DETAIL_KEYS = ("step", "tier", "cause", "layer", "status", "reason", "source")


def num(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def spans(ranks: list[int]) -> str:
    """Sorted ranks as runs: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7, 8" (a thousand ranks stay one short line)."""
    runs: list[list[int]] = []
    for r in ranks:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{lo}-{hi}" if hi > lo + 1 else ", ".join(map(str, range(lo, hi + 1))) for lo, hi in runs)


def state_source(a: RunAnalysis, r: Recovery) -> str:
    """Where a recovery's state came from: the tier of its ckpt_load, else the resume's source
    (`source=torch.load` for a script's own snapshot), as the text report's timeline says it."""
    if r.tier:
        return r.tier
    later = [e for e in a.timeline if e["kind"] == "resume" and e["t"] >= r.t_fault]
    if later and later[0].get("source"):
        return f"source={later[0]['source']}"
    return "no checkpoint (from scratch)" if r.resumed_step == 0 else "not recorded"


def rollback(a: RunAnalysis, r: Recovery) -> str:
    """`27->26 (memory)`: the highest step before the fault, the step resumed from, where from."""
    return f"{r.last_step}->{r.resumed_step} ({state_source(a, r)})"


#: Columns of the faults table (its phases are the phases table)
RECOVERY_HEAD = ("#", "t (s)", "layer", "cause", "rank", "total (s)", "rollback", "steps lost")


def recovery_rows(a: RunAnalysis) -> list[list[str]]:
    """One row per recovery: when, which layer and cause (* a drill), the rank, the time to the first
    step ("none": the new epoch made no step), the rollback and the steps it cost."""
    return [[str(i), f"{r.t_fault:.1f}", r.layer, r.cause + ("*" if r.injected else ""),
             "-" if r.rank is None else str(r.rank), num(r.total) if r.total is not None else "none",
             rollback(a, r), str(r.rollback_steps)]
            for i, r in enumerate(a.recoveries, 1)]


CAUSE_HEAD = ("restart cause", "count")


def cause_rows(a: RunAnalysis) -> list[list[str]]:
    """`layer: cause` and how many recoveries it started, the most frequent first."""
    return [[cause, str(n)] for cause, n in sorted(a.causes.items(), key=lambda kv: -kv[1])]


def stats_rows(a: RunAnalysis) -> list[list[str]]:
    """p50 / p95 / max of each phase that some recovery had (a phase no recovery had is left
    out, e.g. start workers in a run without `spawned`), then the rollback in steps."""
    rows = [[label, num(s["p50"]), num(s["p95"]), num(s["max"])]
            for key, label in RECOVERY_STATS if (s := a.recovery_stats.get(key)) is not None and s["count"]]
    r = a.rollback_stats
    rows.append(["rollback (steps)", num(r["p50"], ".0f"), num(r["p95"], ".0f"), num(r["max"], ".0f")])
    return rows


def phase_rows(a: RunAnalysis) -> list[list[str]]:
    """One row per recovery: its number and the seconds of each phase ("-": not that recovery's)."""
    return [[str(i), *(num(getattr(rec, key)) for key, _ in RECOVERY_PHASES)]
            for i, rec in enumerate(a.recoveries, 1)]


def event_detail(e: dict[str, Any]) -> str:
    return " ".join(f"{k}={e[k]}" for k in DETAIL_KEYS if k in e)


def summary_rows(a: RunAnalysis) -> list[tuple[str, str]]:
    """The goodput table: the answers an operator asks first (steps kept and lost, freshness, ...)."""
    cal, f = a.calibration, a.freshness
    newest = a.series[-1] if a.series else None
    rows = [
        ("wall time", f"{a.wall_s:.1f} s"),
        ("training goodput", f"{a.training_goodput:.2%} ({a.productive_s:.1f} s of kept steps)"),
        ("infrastructure goodput", f"{a.infrastructure_goodput:.2%} ({a.up_s:.1f} s with the workers up)"),
        ("steps completed", f"{a.kept_steps} kept of {a.steps_run} run; final step {a.final_step}"),
        ("steps lost", f"{a.steps_run - a.kept_steps} rolled back and run again"),
        ("ranks", f"{len(a.ranks)}: {spans(a.ranks)}"),
        ("step compute", f"{cal.step_time:.4g} s mean, {cal.step_time_p50:.4g} s p50 ({cal.step_samples} steps)"),
        ("checkpoints", f"{a.checkpoints} durable" + (f" ({a.snapshots} of them the script's own saves: torch.save, DCP)"
                                                    if a.snapshots else "")
         + f"; stall {num(cal.stall, '.4g')} s, wait {num(cal.waited, '.4g')} s, write {num(cal.write, '.4g')} s "
           f"mean; interval {cal.interval_steps or '-'} steps"),
    ]
    if cal.mem_snapshots:
        rows.append(("memory snapshots", f"{cal.mem_snapshots} (reference rank); stall {num(cal.mem_stall, '.4g')} s, "
                                         f"wait {num(cal.mem_waited, '.4g')} s, commit {num(cal.mem_commit, '.4g')} s "
                                         f"mean; every {cal.memory_every or '-'} steps"))
    rows.append(("checkpoint freshness", f"mean {num(f['mean_age_steps'], '.1f')} steps / {num(f['mean_age_s'], '.1f')} s, "
                                         f"max {num(f['max_age_steps'], '.0f')} steps / {num(f['max_age_s'], '.1f')} s"))
    if newest is not None:
        rows.append(("newest checkpoint at the end", f"{newest.age_steps} steps / {newest.age_s:.1f} s old at step "
                                                     f"{newest.step}"))
    if a.failed_saves or a.skipped_checkpoints:
        last = f"; last: {a.last_save_error}" if a.last_save_error else ""
        rows.append(("checkpoint problems", f"{a.failed_saves} failed save(s){last}; {a.skipped_checkpoints} "
                                            "damaged or unusable checkpoint(s) skipped by a load (see ckpt_skip)"))
    rows.append(("faults", f"{len(a.recoveries)} recovered" if a.recoveries else "none: the run never restarted"))
    guard = getattr(a, "crash_loop_guard", None)  # load_analysis adds it (plan.json and fatal.json)
    if guard:
        rows.append(("crash-loop guard", guard))
    if a.damaged_lines:
        rows.append(("events", f"{a.damaged_lines} damaged line(s) skipped (not valid records, see docs/events.md)"))
    return rows


def timeline_rows(a: RunAnalysis, limit: int) -> list[list[str]]:
    """The events but steps, stalls and durable-checkpoint records, the first `limit` of them."""
    shown = [e for e in a.timeline if e["kind"] != "ckpt_persist"]
    rows = [[f"{e['t']:.2f}", str(e["rank"]), str(e["cycle"]), str(e["iteration"]),
             e["kind"] + ("*" if e.get("injected") else ""), event_detail(e)]
            for e in shown[:limit]]
    if len(shown) > limit:
        rows.append(["...", "", "", "", f"{len(shown) - limit} more (see --json)", ""])
    return rows


RANKS_SHOWN = 16  # ranks listed in full; beyond it, the slowest and every named one
RANK_HEAD = ("rank", "steps", "median (s)", "mean (s)", "own work (s)", "vs others", "straggler")


def rank_rows(rank_steps: list[dict[str, Any]]) -> tuple[str, list[list[str]]] | None:
    """(title, rows) of the per-rank step table (`resctl.telemetry.ranks.RankSteps.rows`); None
    with fewer than two timed ranks (nothing to compare)."""
    timed = [r for r in rank_steps if r["median_s"] is not None]
    if len(timed) < 2:
        return None
    shown, title = timed, "step time per rank"
    if len(timed) > RANKS_SHOWN:
        slowest = sorted(timed, key=lambda r: -(r["ratio"] or 0))[: RANKS_SHOWN // 2]
        shown = sorted({r["rank"]: r for r in [*slowest, *(r for r in timed if r["straggler_events"])]}.values(),
                       key=lambda r: r["rank"])
        title += f" (the {len(shown)} slowest or named of {len(timed)}; --json lists all)"
    if any(r.get("ratio_of") == "busy" for r in shown):
        title += (" (own work: the step less its waits in collectives, which every rank waits in for the slowest;"
                  " compared by it)")
    return title, [[str(r["rank"]), str(r["steps"]), f"{r['median_s']:.4g}", f"{r['mean_s']:.4g}",
                    "-" if r.get("busy_median_s") is None else f"{r['busy_median_s']:.4g}",
                    "-" if r["ratio"] is None else f"{r['ratio']:.2f}x",
                    f"named x{r['straggler_events']} (step {r['named_at_step']})" if r["straggler_events"] else ""]
                   for r in shown]


def crash_loop_guard(limit: int | None, fatal: dict[str, Any] | None) -> str:
    """The no-progress stop as the run had it (`limit`: plan.json's `health.no_progress_cycles`, None when the
    run has no plan) and whether it acted (fatal.json's `cause: no_progress`); "" when neither says."""
    if fatal is not None and fatal.get("cause") == "no_progress":
        return f"stopped the job (exit {fatal.get('exit_code')}): {fatal.get('error', '')}"
    if limit is None:
        return ""
    if limit <= 0:
        return "off (health.no_progress_cycles = 0): failed cycles restart up to launch.max_restarts"
    return f"on: stops (exit 93) after {limit} launcher cycle(s) in a row without progress (health.no_progress_cycles)"
