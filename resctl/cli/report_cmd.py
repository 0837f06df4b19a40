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

from resctl.cli.render import info, out_console
from resctl.errors import UsageError
from resctl.profile.contract import health_limits, read_fatal

EPILOG = "Examples: resctl report resctl-runs/abc  |  resctl report resctl-runs/abc --html report.html  |  resctl report DIR --json"


def load_analysis(run_dir: Path) -> Any:
    """`RunAnalysis` of a run directory; `UsageError` (exit 2) when it is not one. Damaged lines
    of the events files are skipped and counted (`damaged_lines`)."""
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
        analysis.crash_loop_guard = _guard(run_dir, plan)  # type: ignore[attr-defined]  # report's own addition
        return analysis
    except OSError as err:
        raise UsageError(f"{run_dir}: cannot read the events: {err}") from None
    except ValueError as err:
        detail = f"; {stats.damaged} damaged line(s) skipped, e.g. {stats.examples[0]}" if stats.damaged else ""
        raise UsageError(f"{run_dir}: {err}{detail}; the events must follow docs/events.md") from None


def _guard(run_dir: Path, plan: Any) -> str:
    from resctl.telemetry.report_rows import crash_loop_guard

    limit = health_limits(plan).no_progress_cycles if isinstance(plan, dict) else None
    return crash_loop_guard(limit, read_fatal(run_dir))


def report(
    run_dir: Annotated[Path, typer.Argument(help="Run directory (holds events-rank*.jsonl).")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Also write a self-contained HTML report with plots.")] = None,
) -> None:
    """Goodput and recovery of a run: text, JSON or HTML.

    Training and infrastructure goodput, per-fault recovery, rollback and checkpoint freshness.
    """
    analysis = load_analysis(run_dir)
    if html is not None:
        from resctl.telemetry.report_html import render_html

        try:
            html.write_text(render_html(analysis, title=f"resctl report: {run_dir}"), encoding="utf-8")
        except OSError as err:
            raise UsageError(f"--html {html}: cannot write it: {err}") from None
    if as_json:
        typer.echo(json.dumps({**analysis.to_json(), "rank_steps": analysis.rank_steps,
                               "crash_loop_guard": analysis.crash_loop_guard}, indent=2))
    else:
        _render(analysis)
        from resctl.cli.report_ranks import render_ranks

        render_ranks(analysis.rank_steps)
    if html is not None:
        info(f"wrote {html}")


TIMELINE_ROWS = 60  # rows of the terminal's event table (the rest: --json, --html)


def _render(a: Any) -> None:
    from rich.table import Table

    from resctl.telemetry import report_rows as rows

    head = Table("measure", "value", title="goodput")
    for measure, value in rows.summary_rows(a):
        head.add_row(measure, value)
    out_console.print(head)

    if a.recoveries:
        stats = Table(*rows.STATS_HEAD, title=f"recovery of {len(a.recoveries)} fault(s)")
        for row in rows.stats_rows(a):
            stats.add_row(*row)
        out_console.print(stats)
        per = Table(*rows.RECOVERY_HEAD, title="faults")
        for row in rows.recovery_rows(a):
            per.add_row(*row)
        out_console.print(per)
        phases = Table(*rows.PHASE_HEAD, title="recovery phases per fault (s)", caption=rows.PHASES_NOTE)
        for row in rows.phase_rows(a):
            phases.add_row(*row)
        out_console.print(phases)
        if any(rec.injected for rec in a.recoveries):
            out_console.print("* injected by a fault drill")
        causes = Table(*rows.CAUSE_HEAD, title="restart causes")
        for row in rows.cause_rows(a):
            causes.add_row(*row)
        out_console.print(causes)
    else:
        out_console.print("no faults: the run never restarted")

    timeline = Table("t (s)", "rank", "cycle", "iter", "event", "detail", title="timeline (steps and stalls omitted)")
    for row in rows.timeline_rows(a, TIMELINE_ROWS):
        timeline.add_row(*row)
    out_console.print(timeline)
