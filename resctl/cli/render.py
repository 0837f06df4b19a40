"""Shared rendering: talk goes to stderr, data to stdout."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from rich.console import Console
from rich.text import Text

# Not a terminal (a log, an init container, a Slurm prolog) and no COLUMNS: rich would lay tables
# out in 80 columns, a word a line; logs take long lines, so tables get this width instead.
LOG_WIDTH = 200


def _width(stream: TextIO) -> int | None:
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS") else LOG_WIDTH


err_console = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))
out_console = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))


def error(message: str) -> None:
    err_console.print(Text("error: ", style="bold red") + Text(message))


def info(message: str, style: str = "") -> None:
    err_console.print(Text(message, style=style))
