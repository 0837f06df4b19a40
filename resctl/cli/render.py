"""Shared rendering: talk goes to stderr, data to stdout."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

err_console = Console(stderr=True, highlight=False, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)


def error(message: str) -> None:
    err_console.print(Text("error: ", style="bold red") + Text(message))


def info(message: str, style: str = "") -> None:
    err_console.print(Text(message, style=style))
