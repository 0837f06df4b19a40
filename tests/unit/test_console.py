"""resctl's own lines on a worker's console arrive whole (resctl/console.py): one write each, where
`print(..., file=sys.stderr)` makes two and another process of the job can write between them."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from resctl import console

PKG = Path(__file__).resolve().parents[2] / "resctl"


class _Writes(io.RawIOBase):
    """A raw stream that records each write it is given (what reaches the file descriptor)."""

    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[no-untyped-def, override]
        self.calls.append(bytes(b))
        return len(b)


def _stderr_like() -> tuple[_Writes, io.TextIOWrapper]:
    """A stream built as the interpreter builds stderr: text writing through straight to the file (no buffer)."""
    raw = _Writes()
    return raw, io.TextIOWrapper(raw, encoding="utf-8", write_through=True)  # type: ignore[arg-type]


def test_the_interpreters_stderr_is_built_so() -> None:
    """What `_stderr_like` copies: a worker's stderr (with -u and without) writes through to a raw file."""
    show = "import sys; print(type(sys.stderr.buffer).__name__, sys.stderr.write_through)"
    for flags in (["-u"], []):
        out = subprocess.run([sys.executable, *flags, "-c", show], capture_output=True, text=True, check=True)
        assert out.stdout.split() == ["FileIO", "True"], flags


def test_a_line_is_one_write_where_print_is_two(monkeypatch: pytest.MonkeyPatch) -> None:
    raw, stream = _stderr_like()
    monkeypatch.setattr(sys, "stderr", stream)
    print("resctl: printed", file=sys.stderr, flush=True)
    assert raw.calls == [b"resctl: printed", b"\n"]  # why: the two halves another process can split
    raw.calls.clear()
    console.line("resctl: one write")
    assert raw.calls == [b"resctl: one write\n"]


def test_no_stderr_writes_nothing_as_print_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stderr", None)
    console.line("resctl: nowhere")  # no AttributeError, as print(file=None) with sys.stderr None


def test_lines_of_two_processes_on_one_pipe_stay_whole() -> None:
    """Two real processes write to one pipe at once, as a worker and the script's other process share a console:
    each resctl line arrives in one piece (its text and newline together), however the other process's writes fall."""
    writer = textwrap.dedent("""
        import sys
        from resctl import console
        for i in range(2000):
            if sys.argv[1] == "resctl":
                console.line(f"resctl: line {i:05d} " + "x" * 200)
            else:  # text and newline apart, as print() in an unbuffered process
                sys.stderr.write(f"OUT {i:05d}")
                sys.stderr.write("\\n")
        """)
    r, w = os.pipe()
    try:
        procs = [subprocess.Popen([sys.executable, "-u", "-c", writer, who], stderr=w, cwd=PKG.parent)
                 for who in ("resctl", "script")]
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as pipe:
        got = pipe.read().decode()
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    missing = [i for i in range(2000) if f"resctl: line {i:05d} " + "x" * 200 + "\n" not in got]
    assert missing == []
    assert got.count("OUT ") == 2000


def test_resctl_prints_no_line_of_its_own_through_print() -> None:
    """A `print("resctl: ...")` / `print(f"resctl: ...")` anywhere in the package is two writes: use console.line."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"):
                continue
            first = node.args[0] if node.args else None
            text = first.value if isinstance(first, ast.Constant) else (
                first.values[0].value if isinstance(first, ast.JoinedStr) and first.values
                and isinstance(first.values[0], ast.Constant) else None)
            if isinstance(text, str) and text.startswith("resctl: "):
                found.append(f"{path.relative_to(PKG.parent)}:{node.lineno}")
    assert found == []
