"""`resctl report`'s per-rank step table (rows from `resctl.telemetry.ranks.RankSteps`)."""

from __future__ import annotations

from typing import Any

SHOWN = 16  # ranks listed in full; beyond it, the slowest and every named one


def render_ranks(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table

    from resctl.cli.render import out_console

    timed = [r for r in rows if r["median_s"] is not None]
    if len(timed) < 2:
        return
    shown = timed
    title = "step time per rank"
    if len(timed) > SHOWN:
        slowest = sorted(timed, key=lambda r: -(r["ratio"] or 0))[: SHOWN // 2]
        shown = sorted({r["rank"]: r for r in [*slowest, *(r for r in timed if r["straggler_events"])]}.values(),
                       key=lambda r: r["rank"])
        title += f" (the {len(shown)} slowest or named of {len(timed)}; --json lists all)"
    table = Table("rank", "steps", "median (s)", "mean (s)", "vs others", "straggler", title=title)
    for r in shown:
        named = f"named x{r['straggler_events']} (step {r['named_at_step']})" if r["straggler_events"] else ""
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        table.add_row(str(r["rank"]), str(r["steps"]), f"{r['median_s']:.4g}", f"{r['mean_s']:.4g}", ratio, named)
    out_console.print(table)
