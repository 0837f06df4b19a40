"""A self-contained HTML page for `resctl report --html`: what the text report says, and plots.

An operator answers from the page alone: steps completed and lost, how far each fault rolled
back and where the state came from, how fresh the newest checkpoint was (steps and seconds),
each restart's cause and layer (drills marked), training vs infrastructure goodput over time,
the ranks, memory snapshots and the event timeline. Tables carry ids (`summary`, `recoveries`,
`recovery-phases`, `recovery-stats`, `causes`, `ranks`, `timeline`) so a test can read the rendered page.

plotly.js is inlined once (about 4.7 MB), so the file opens from disk in any browser with no
server and no network (clusters are often air-gapped). Figures: a timeline of the reference
rank's steps (rolled-back steps greyed) with faults, restarts of each layer (at the step they
interrupted), resumes and durable checkpoints; goodput over time (training and infrastructure);
checkpoint freshness in steps and seconds; and the recovery phases of every fault.
plotly is imported here only, so `resctl --help` and the terminal report never load it.
"""

from __future__ import annotations

import bisect
import html
from typing import Any, Iterable, Sequence

from resctl.telemetry.goodput import RECOVERY_PHASES, RunAnalysis
from resctl.telemetry.report_rows import (
    CAUSE_HEAD,
    PHASE_HEAD,
    PHASES_NOTE,
    RANK_HEAD,
    RECOVERY_HEAD,
    STATS_HEAD,
    cause_rows,
    event_detail,
    phase_rows,
    rank_rows,
    recovery_rows,
    rollback,
    stats_rows,
    summary_rows,
    timeline_rows,
)

#: The bar colour of each recovery phase (goodput.RECOVERY_PHASES: a test checks both name the same phases)
PHASE_COLORS = {"detection": "#d62728", "stop": "#e377c2", "rendezvous": "#ff7f0e", "start_workers": "#bcbd22",
                "load": "#1f77b4", "first_step": "#2ca02c"}
TIMELINE_ROWS = 2000  # rows of the event table (the rest: --json)
RESTART_MARKS = {"launcher": ("launcher restart", "square", "#8c564b"),
                 "inprocess": ("in-process restart", "star", "#ff7f0e")}


def _step_at(a: RunAnalysis, t: float) -> int:
    """The reference rank's step at time t (the last one made before it); 0 before the first."""
    times = [s.t for s in a.series]
    i = bisect.bisect_right(times, t) - 1
    return a.series[i].step if i >= 0 else 0


def figures(a: RunAnalysis) -> list[Any]:
    """The plotly figures of the report (timeline + goodput + freshness; recovery phases)."""
    import plotly.graph_objects as go  # type: ignore[import-untyped]
    from plotly.subplots import make_subplots  # type: ignore[import-untyped]

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.07, row_heights=[0.5, 0.25, 0.25],
                        specs=[[{}], [{}], [{"secondary_y": True}]],
                        subplot_titles=("timeline: steps, faults, restarts, checkpoints",
                                        "goodput so far: training and infrastructure",
                                        "checkpoint freshness: age of the newest durable checkpoint"))
    kept = [s for s in a.series if s.kept]
    lost = [s for s in a.series if not s.kept]
    fig.add_trace(go.Scatter(x=[s.t for s in kept], y=[s.step for s in kept], mode="markers", name="step (kept)",
                             marker={"size": 4, "color": "#1f77b4"}), row=1, col=1)
    if lost:
        fig.add_trace(go.Scatter(x=[s.t for s in lost], y=[s.step for s in lost], mode="markers",
                                 name="step (rolled back)", marker={"size": 4, "color": "#bbbbbb"}), row=1, col=1)
    marks = {
        "ckpt_persist": ("checkpoint durable", "triangle-up", "#2ca02c"),
        "snapshot": ("torch.save snapshot", "triangle-up-open", "#2ca02c"),
        "resume": ("resume (state loaded)", "diamond", "#9467bd"),
        "start": ("worker start", "circle-open", "#7f7f7f"),
    }
    for kind, (label, symbol, color) in marks.items():
        evs = [e for e in a.timeline if e["kind"] == kind]
        if evs:
            fig.add_trace(go.Scatter(
                x=[e["t"] for e in evs], y=[e.get("step", _step_at(a, e["t"])) for e in evs], mode="markers",
                name=label, marker={"symbol": symbol, "size": 9, "color": color},
                text=[_describe(e) for e in evs]), row=1, col=1)
    for layer, (label, symbol, color) in RESTART_MARKS.items():
        evs = [e for e in a.timeline if e["kind"] == "restart" and e.get("layer") == layer]
        if evs:  # a launcher restart's worker has no step yet: drawn at the step the fault interrupted
            fig.add_trace(go.Scatter(
                x=[e["t"] for e in evs], y=[e.get("step", _step_at(a, e["t"])) for e in evs], mode="markers",
                name=label, marker={"symbol": symbol, "size": 11, "color": color},
                text=[_describe(e) for e in evs]), row=1, col=1)
    faults = [e for e in a.timeline if e["kind"] == "fault"]
    if faults:
        fig.add_trace(go.Scatter(
            x=[e["t"] for e in faults], y=[e.get("step", _step_at(a, e["t"])) for e in faults], mode="markers",
            name="fault (* drill)", marker={"symbol": "x", "size": 12, "color": "#d62728"},
            text=[_describe(e) for e in faults]), row=1, col=1)
    for r in a.recoveries:
        if r.total is not None:
            fig.add_vrect(x0=r.t_fault, x1=r.t_fault + r.total, fillcolor="#d62728", opacity=0.08, line_width=0,
                          row=1, col=1)
    xs = [s.t for s in a.series]
    fig.add_trace(go.Scatter(x=xs, y=[s.goodput for s in a.series], mode="lines", name="training goodput",
                             line={"color": "#1f77b4"}), row=2, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[s.infra for s in a.series], mode="lines", name="infrastructure goodput",
                             line={"color": "#7f7f7f", "dash": "dot"}), row=2, col=1)
    fig.add_trace(go.Scatter(x=xs, y=[s.age_steps for s in a.series], mode="lines", name="checkpoint age (steps)",
                             line={"color": "#2ca02c", "shape": "hv"}), row=3, col=1, secondary_y=False)
    fig.add_trace(go.Scatter(x=xs, y=[s.age_s for s in a.series], mode="lines", name="checkpoint age (s)",
                             line={"color": "#17becf", "dash": "dash"}), row=3, col=1, secondary_y=True)
    fig.update_yaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="goodput", tickformat=".0%", range=[0, 1.05], row=2, col=1)
    fig.update_yaxes(title_text="steps", row=3, col=1, secondary_y=False)
    fig.update_yaxes(title_text="seconds", row=3, col=1, secondary_y=True)
    fig.update_xaxes(title_text="seconds since the run started", row=3, col=1)
    fig.update_layout(height=950, template="plotly_white", legend={"orientation": "h", "y": -0.1},
                      margin={"b": 160})
    out = [fig]

    if a.recoveries:
        bars = go.Figure()
        labels = [f"#{i + 1} {r.layer}: {r.cause}{'*' if r.injected else ''} @ {r.t_fault:.0f}s, "
                  f"{rollback(a, r)}" for i, r in enumerate(a.recoveries)]
        for phase, label in RECOVERY_PHASES:  # a phase no recovery had (no `spawned`: start workers) is left out
            seconds = [getattr(r, phase) for r in a.recoveries]
            if any(v is not None for v in seconds):
                bars.add_trace(go.Bar(y=labels, x=[v or 0.0 for v in seconds], name=label, orientation="h",
                                      marker_color=PHASE_COLORS[phase]))
        # every phase in the legend, above the bars; each bar tall enough for its label
        bars.update_layout(barmode="stack", title="recovery time per fault (seconds)", template="plotly_white",
                           height=260 + 48 * len(labels), yaxis={"autorange": "reversed", "automargin": True},
                           legend={"orientation": "h", "x": 0, "y": 1.0, "yanchor": "bottom", "traceorder": "normal"},
                           margin={"t": 110})
        out.append(bars)
    return out


def _describe(e: dict[str, Any]) -> str:
    return f"{e['kind']}{'*' if e.get('injected') else ''} rank {e['rank']} cycle {e['cycle']} " \
           f"iteration {e['iteration']}: {event_detail(e)}"


def _table(table_id: str, head: Sequence[str], rows: Iterable[Sequence[str]], caption: str = "") -> str:
    cap = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table id="{table_id}">{cap}<thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>'


def render_html(a: RunAnalysis, title: str = "resctl report") -> str:
    """The whole page as a string."""
    summary = _table("summary", ("measure", "value"), summary_rows(a))
    sections = [f"<h2>Goodput, steps and checkpoints</h2>{summary}"]
    if a.recoveries:
        drill = "; * injected by a fault drill" if any(r.injected for r in a.recoveries) else ""
        sections.append(f"<h2>Faults and recovery ({len(a.recoveries)})</h2>" + _table(
            "recoveries", RECOVERY_HEAD, recovery_rows(a),
            caption=f"one row per recovered fault, times in seconds{drill}"))
        sections.append(_table("recovery-phases", PHASE_HEAD, phase_rows(a),
                               caption=f"recovery phases per fault (s): {PHASES_NOTE}"))
        sections.append(_table("recovery-stats", STATS_HEAD, stats_rows(a)))
        sections.append("<h2>Restart causes</h2>" + _table("causes", CAUSE_HEAD, cause_rows(a)))
    else:
        sections.append("<h2>Faults and recovery</h2><p>no faults: the run never restarted</p>")
    ranks = rank_rows(getattr(a, "rank_steps", []))  # load_analysis adds them (one pass with the events)
    if ranks is not None:
        sections.append(f"<h2>Ranks</h2>{_table('ranks', RANK_HEAD, ranks[1], caption=ranks[0])}")
    figs = figures(a)
    plots = "".join(fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
                    for i, fig in enumerate(figs))
    events = _table("timeline", ("t (s)", "rank", "cycle", "iter", "event", "detail"), timeline_rows(a, TIMELINE_ROWS),
                    caption="steps, stalls and durable-checkpoint records omitted (see the plot and --json); "
                            "* injected by a fault drill")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1400px}}
table{{border-collapse:collapse;margin:1em 0}}th,td{{text-align:left;padding:.2em 1em;border-bottom:1px solid #ddd}}
th{{font-weight:600}}caption{{caption-side:bottom;text-align:left;color:#555;padding-top:.3em}}</style></head>
<body><h1>{html.escape(title)}</h1>
{''.join(sections)}
<h2>Plots</h2>{plots}
<h2>Event timeline</h2>{events}
</body></html>
"""
