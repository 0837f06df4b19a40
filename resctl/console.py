"""resctl's own lines on a worker's console, one `write` each.

`print(text, file=sys.stderr)` writes the text and then its newline (stderr writes through, and a worker runs
unbuffered, as `python -u` makes torchrun's), so another process of the job can write between the two on the
console they share, and a line of the script's lands inside resctl's. `line()` writes the text and its newline
in one call: on a pipe, up to PIPE_BUF bytes (4 KiB on Linux) arrive whole.
"""

from __future__ import annotations

import sys


def line(text: str) -> None:
    """Write `text` and a newline to stderr in one write, and flush; no stderr (None), nothing, as print()."""
    stream = sys.stderr
    if stream is None:
        return
    stream.write(text + "\n")
    stream.flush()
