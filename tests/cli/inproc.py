"""Drive `resctl` in-process (its real `main()`, typer and rendering included): fast enough for fuzzing."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence
from unittest import mock

from resctl.cli import INTERNAL, main


@dataclass
class Result:
    code: int
    out: str
    err: str
    crash: str = ""  # an exception that escaped main(), or one main() reported as a bug: always a defect

    @property
    def text(self) -> str:
        return self.out + self.err


def invoke(args: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None) -> Result:
    """Run `resctl ARGS` in this process with only `env`'s RESCTL_* variables, in `cwd`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
    # Like a real process's streams: stdout is strict UTF-8 (text that cannot be encoded fails there), stderr
    # escapes what it cannot encode.
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace", write_through=True)
    code, crash = 0, ""
    old_cwd = os.getcwd()
    with mock.patch.dict(os.environ, {**clean, "COLUMNS": "200", **(env or {})}, clear=True), \
            mock.patch.object(sys, "argv", ["resctl", *args]), \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        os.chdir(cwd)
        try:
            main()
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:  # noqa: BLE001 - what escapes main() is exactly what the tests look for
            code, crash = 1, traceback.format_exc()
        finally:
            os.chdir(old_cwd)
    result = Result(code, _text(out), _text(err), crash)
    if INTERNAL in result.err:  # main() caught a bug and said so in one line: still a crash to the tests
        result.crash = result.err
    return result


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    raw = stream.buffer
    assert isinstance(raw, io.BytesIO)
    return raw.getvalue().decode("utf-8", "replace")
