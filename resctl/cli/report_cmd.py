"""`resctl report RUN_DIR`: goodput, recovery times, rollback, checkpoint freshness, restart causes.

Reads only the run's `events-rank*.jsonl` (and `plan.json` for the checkpoint settings); the
definitions are in `resctl.telemetry.goodput`. Terminal tables by default, `--json` for one
document on stdout, `--html FILE` for a self-contained page with plots (plotly, inlined: it opens
from disk, no server or network).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

EPILOG = "Examples: resctl report resctl-runs/abc  |  resctl report resctl-runs/abc --html report.html  |  resctl report DIR --json"


def load_analysis(run_dir: Path) -> Any:
    """`RunAnalysis` of a run directory; `UsageError` (exit 2) when it is not one. Damaged lines
    of the events files are skipped and counted (`damaged_lines`)."""
    from resctl.errors import UsageError
    from resctl.telemetry.events import ReadStats, rank_files, read_run, reference_rank
    from resctl.telemetry.goodput import analyze_stream

    if not run_dir.is_dir():
        raise UsageError(f"{run_dir}: no such run directory; give the run_dir `resctl run` printed "
                         "(default resctl-runs/<run id>)")
    ranks = rank_files(run_dir)
    if not ranks:
        raise UsageError(f"{run_dir}: no events-rank*.jsonl files: not a resctl run directory, or the workers "
                         "never started (check the launcher log)")
    from resctl.launch.plan import PLAN_FILE, read_plan

    plan = read_plan(run_dir / PLAN_FILE)  # None when absent or damaged: the events alone are enough
    from resctl.telemetry.ranks import RankSteps

    stats = ReadStats()
    per_rank = RankSteps()  # the per-rank step table, fed in the same pass
    try:
        analysis = analyze_stream(per_rank.watch(read_run(run_dir, stats)), plan if isinstance(plan, dict) else None,
                                  ref=reference_rank(ranks))
        analysis.damaged_lines = stats.damaged
        analysis.rank_steps = per_rank.rows()  # type: ignore[attr-defined]  # report's own addition
        return analysis
    except OSError as err:
        raise UsageError(f"{run_dir}: cannot read the events: {err}") from None
    except ValueError as err:
        detail = f"; {stats.damaged} damaged line(s) skipped, e.g. {stats.examples[0]}" if stats.damaged else ""
        raise UsageError(f"{run_dir}: {err}{detail}; the events must follow docs/events.md") from None


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (holds events-rank*.jsonl).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Also write a self-contained HTML report with plots.")] = None,
) -> None:
    """Goodput and recovery of a run: text, JSON or HTML.

    Training and infrastructure goodput, per-fault recovery, rollback and checkpoint freshness.
    """
    from resctl.cli.render import info
    from resctl.errors import UsageError

    analysis = load_analysis(run_dir)
    if html is not None:
        from resctl.telemetry.report_html import render_html

        try:
            html.write_text(render_html(analysis, title=f"resctl report: {run_dir}"), encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--html {html}: cannot write it: {err}") from None
    if as_json:
        typer.echo(json.dumps({**analysis.to_json(), "rank_steps": analysis.rank_steps}, indent=2))
    else:
        _render(analysis)
        from resctl.cli.report_ranks import render_ranks

        render_ranks(analysis.rank_steps)
    if html is not None:
        info(f"wrote {html}")


#: The recovery phases of the stats table, in order (resctl.telemetry.goodput's module docstring
#: defines them; bench/scale measures the coordination ones at N simulated nodes).
RECOVERY_PHASES = (
    ("total", "total (fault -> first step)"), ("detection", "detect"), ("stop", "stop"),
    ("rendezvous", "rendezvous"), ("start_workers", "start workers"),
    ("restart", "restart (stop + rendezvous + start)"), ("load", "restore"), ("first_step", "first step"),
)


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _render(a: Any) -> None:
    from rich.table import Table

    from resctl.cli.render import out_console

    cal = a.calibration
    head = Table("measure", "value", title="goodput")
    head.add_row("wall time", f"{a.wall_s:.1f} s")
    head.add_row("training goodput", f"{a.training_goodput:.2%}  ({a.productive_s:.1f} s of kept steps)")
    head.add_row("infrastructure goodput", f"{a.infrastructure_goodput:.2%}  ({a.up_s:.1f} s with the workers up)")
    head.add_row("steps", f"{a.kept_steps} kept of {a.steps_run} run; final step {a.final_step}")
    head.add_row("ranks", f"{len(a.ranks)}")
    head.add_row("step compute", f"{cal.step_time:.4g} s mean, {cal.step_time_p50:.4g} s p50 ({cal.step_samples} steps)")
    snaps = f" ({a.snapshots} of them the script's torch.save snapshots)" if a.snapshots else ""
    head.add_row("checkpoints", f"{a.checkpoints} durable{snaps}; stall {_num(cal.stall, '.4g')} s, wait "
                                f"{_num(cal.waited, '.4g')} s, write {_num(cal.write, '.4g')} s mean; "
                                f"interval {cal.interval_steps or '-'} steps")
    if cal.mem_snapshots:
        head.add_row("memory snapshots", f"{cal.mem_snapshots} (reference rank); stall {_num(cal.mem_stall, '.4g')} s, "
                                         f"wait {_num(cal.mem_waited, '.4g')} s, commit {_num(cal.mem_commit, '.4g')} s "
                                         f"mean; every {cal.memory_every or '-'} steps")
    f = a.freshness
    head.add_row("checkpoint freshness", f"mean {_num(f['mean_age_steps'], '.1f')} steps / {_num(f['mean_age_s'], '.1f')} s, "
                                         f"max {_num(f['max_age_steps'], '.0f')} steps / {_num(f['max_age_s'], '.1f')} s")
    if a.failed_saves or a.skipped_checkpoints:
        last = f"; last: {a.last_save_error}" if a.last_save_error else ""
        head.add_row("checkpoint problems", f"{a.failed_saves} failed save(s){last}; {a.skipped_checkpoints} "
                                            "damaged or unusable checkpoint(s) skipped by a load (see ckpt_skip)")
    if a.damaged_lines:
        head.add_row("events", f"{a.damaged_lines} damaged line(s) skipped (not valid records, see docs/events.md)")
    out_console.print(head)

    if a.recoveries:
        stats = Table("recovery (s)", "p50", "p95", "max", title=f"recovery of {len(a.recoveries)} fault(s)")
        for phase, label in RECOVERY_PHASES:
            s = a.recovery_stats.get(phase)
            if s is not None and s["count"]:
                stats.add_row(label, _num(s["p50"]), _num(s["p95"]), _num(s["max"]))
        r = a.rollback_stats
        stats.add_row("rollback (steps)", _num(r["p50"], ".0f"), _num(r["p95"], ".0f"), _num(r["max"], ".0f"))
        out_console.print(stats)
        per = Table("#", "t (s)", "fault", "total (s)", "rollback", title="faults")
        phases = Table("#", "detect", "stop", "rendezvous", "start workers", "restore", "first step",
                       title="recovery phases per fault (s)")
        for i, rec in enumerate(a.recoveries, 1):
            who = "" if rec.rank is None else f" r{rec.rank}"
            per.add_row(str(i), f"{rec.t_fault:.1f}", f"{rec.layer}: {rec.cause}{who}" + ("*" if rec.injected else ""),
                        _num(rec.total) if rec.total is not None else "none",
                        f"{rec.last_step}->{rec.resumed_step}" + (f" ({rec.tier})" if rec.tier else ""))
            phases.add_row(str(i), _num(rec.detection), _num(rec.stop), _num(rec.rendezvous), _num(rec.start_workers),
                           _num(rec.load), _num(rec.first_step))
        out_console.print(per)
        out_console.print(phases)
        if any(rec.injected for rec in a.recoveries):
            out_console.print("* injected by a fault drill")
        causes = Table("restart cause", "count", title="restart causes")
        for cause, count in sorted(a.causes.items(), key=lambda kv: -kv[1]):
            causes.add_row(cause, str(count))
        out_console.print(causes)
    else:
        out_console.print("no faults: the run never restarted")

    timeline = Table("t (s)", "rank", "cycle", "iter", "event", "detail", title="timeline (steps and stalls omitted)")
    shown = [e for e in a.timeline if e["kind"] != "ckpt_persist"]
    for e in shown[:60]:
        detail = " ".join(f"{k}={e[k]}" for k in ("step", "tier", "cause", "layer", "status", "reason", "source") if k in e)
        timeline.add_row(f"{e['t']:.2f}", str(e["rank"]), str(e["cycle"]), str(e["iteration"]), e["kind"], detail)
    if len(shown) > 60:
        timeline.add_row("...", "", "", "", f"{len(shown) - 60} more (see --json)", "")
    out_console.print(timeline)
