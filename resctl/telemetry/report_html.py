"""A self-contained HTML page for `resctl report --html`: summary tables and plotly figures.

plotly.js is inlined once (about 4.7 MB), so the file opens from disk in any browser with no
server and no network (clusters are often air-gapped). Figures: a timeline of the reference
rank's steps (rolled-back steps greyed) with faults, restarts, resumes and durable checkpoints;
training goodput over time; checkpoint freshness; and the recovery phases of every fault.
plotly is imported here only, so `resctl --help` and the terminal report never load it.
"""

from __future__ import annotations

import html
from typing import Any

from resctl.telemetry.goodput import RunAnalysis

PHASES = (("detection", "#d62728"), ("restart", "#ff7f0e"), ("load", "#1f77b4"), ("first_step", "#2ca02c"))


def figures(a: RunAnalysis) -> list[Any]:
    """The plotly figures of the report (timeline + goodput + freshness; recovery phases)."""
    import plotly.graph_objects as go  # type: ignore[import-untyped]
    from plotly.subplots import make_subplots  # type: ignore[import-untyped]

    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06, row_heights=[0.5, 0.25, 0.25],
                        subplot_titles=("timeline: steps, faults, restarts, checkpoints",
                                        "training goodput so far", "checkpoint freshness (steps since the newest durable one)"))
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
        "resume": ("resume (checkpoint loaded)", "diamond", "#9467bd"),
        "start": ("worker start", "circle-open", "#7f7f7f"),
        "restart": ("in-process restart", "star", "#ff7f0e"),
    }
    for kind, (label, symbol, color) in marks.items():
        evs = [e for e in a.timeline if e["kind"] == kind]
        if evs:
            fig.add_trace(go.Scatter(
                x=[e["t"] for e in evs], y=[e.get("step", 0) for e in evs], mode="markers", name=label,
                marker={"symbol": symbol, "size": 9, "color": color},
                text=[f"rank {e['rank']} cycle {e['cycle']} iteration {e['iteration']}" for e in evs]), row=1, col=1)
    faults = [e for e in a.timeline if e["kind"] == "fault"]
    if faults:
        fig.add_trace(go.Scatter(
            x=[e["t"] for e in faults], y=[e.get("step", 0) for e in faults], mode="markers", name="fault",
            marker={"symbol": "x", "size": 12, "color": "#d62728"},
            text=[f"{e.get('cause')} on rank {e['rank']}" + (" (injected)" if e.get("injected") else "") for e in faults]),
            row=1, col=1)
    for r in a.recoveries:
        if r.total is not None:
            fig.add_vrect(x0=r.t_fault, x1=r.t_fault + r.total, fillcolor="#d62728", opacity=0.08, line_width=0,
                          row=1, col=1)
    fig.add_trace(go.Scatter(x=[s.t for s in a.series], y=[s.goodput for s in a.series], mode="lines",
                             name="training goodput", line={"color": "#1f77b4"}), row=2, col=1)
    fig.add_trace(go.Scatter(x=[s.t for s in a.series], y=[s.age_steps for s in a.series], mode="lines",
                             name="checkpoint age (steps)", line={"color": "#2ca02c", "shape": "hv"}), row=3, col=1)
    fig.update_yaxes(title_text="step", row=1, col=1)
    fig.update_yaxes(title_text="goodput", tickformat=".0%", range=[0, 1.05], row=2, col=1)
    fig.update_yaxes(title_text="steps", row=3, col=1)
    fig.update_xaxes(title_text="seconds since the run started", row=3, col=1)
    fig.update_layout(height=850, template="plotly_white", legend={"orientation": "h", "y": -0.08})
    out = [fig]

    if a.recoveries:
        bars = go.Figure()
        labels = [f"#{i + 1} {r.layer}: {r.cause} @ {r.t_fault:.0f}s, {r.last_step}->{r.resumed_step} from {r.tier or '?'}"
                  for i, r in enumerate(a.recoveries)]
        for phase, color in PHASES:
            bars.add_trace(go.Bar(y=labels, x=[getattr(r, phase) or 0.0 for r in a.recoveries], name=phase.replace("_", " "),
                                  orientation="h", marker_color=color))
        bars.update_layout(barmode="stack", title="recovery time per fault (seconds)", template="plotly_white",
                           height=140 + 40 * len(labels), yaxis={"autorange": "reversed"})
        out.append(bars)
    return out


def _table(rows: list[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{body}</table>"


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def render_html(a: RunAnalysis, title: str = "resctl report") -> str:
    """The whole page as a string."""
    cal, f = a.calibration, a.freshness
    summary = _table([
        ("wall time", f"{a.wall_s:.1f} s"),
        ("training goodput", f"{a.training_goodput:.2%} ({a.productive_s:.1f} s of kept steps)"),
        ("infrastructure goodput", f"{a.infrastructure_goodput:.2%} ({a.up_s:.1f} s with the workers up)"),
        ("steps", f"{a.kept_steps} kept of {a.steps_run} run; final step {a.final_step}"),
        ("step compute", f"{cal.step_time:.4g} s mean ({cal.step_samples} steps)"),
        ("checkpoints", f"{a.checkpoints} durable ({a.snapshots} torch.save snapshots); stall {_fmt(cal.stall, '.4g')} s, write {_fmt(cal.write, '.4g')} s"),
        ("checkpoint freshness", f"mean {_fmt(f['mean_age_steps'], '.1f')} / max {_fmt(f['max_age_steps'], '.0f')} steps"),
        ("faults", ", ".join(f"{k} x{v}" for k, v in a.causes.items()) or "none"),
        ("damaged event lines skipped", str(a.damaged_lines)),
    ])
    rec_rows = []
    for phase in ("total", "detection", "restart", "load", "first_step"):
        s = a.recovery_stats[phase]
        rec_rows.append((phase.replace("_", " "), f"p50 {_fmt(s['p50'])} s, p95 {_fmt(s['p95'])} s, max {_fmt(s['max'])} s"))
    r = a.rollback_stats
    rec_rows.append(("rollback", f"p50 {_fmt(r['p50'], '.0f')}, p95 {_fmt(r['p95'], '.0f')}, max {_fmt(r['max'], '.0f')} steps"))
    rec_rows += [(f"#{i + 1} {x.layer}: {x.cause}", f"rolled back {x.last_step}->{x.resumed_step}, state from "
                  f"{x.tier or 'unknown (no ckpt_load)'}") for i, x in enumerate(a.recoveries)]
    figs = figures(a)
    parts = [fig.to_html(full_html=False, include_plotlyjs=(i == 0), config={"displaylogo": False})
             for i, fig in enumerate(figs)]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;margin:1em 0}}th,td{{text-align:left;padding:.2em 1em;border-bottom:1px solid #ddd}}
th{{font-weight:600}}</style></head>
<body><h1>{html.escape(title)}</h1>
<h2>Goodput</h2>{summary}
<h2>Recovery ({len(a.recoveries)} fault(s))</h2>{_table(rec_rows)}
{''.join(parts)}
</body></html>
"""
