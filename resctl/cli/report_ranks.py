"""`resctl report`'s per-rank step table (rows from `resctl.telemetry.report_rows.rank_rows`)."""

from __future__ import annotations

from typing import Any

from resctl.cli.render import out_console
from resctl.telemetry.report_rows import RANK_HEAD, rank_rows


def render_ranks(rows: list[dict[str, Any]]) -> None:
    from rich.table import Table


    ranks = rank_rows(rows)
    if ranks is None:
        return
    title, cells = ranks
    table = Table(*RANK_HEAD, title=title)
    for row in cells:
        table.add_row(*row)
    out_console.print(table)
