"""A forked worker's way out (resctl/shim/ending.py): whatever the script's objects do when looked at or
flushed, the worker still leaves with the script's status."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

from resctl.shim import ending


class Flaky(io.RawIOBase):
    """A file whose flush raises what no local file does (a remote filesystem's client error)."""

    def writable(self) -> bool:
        return True

    def flush(self) -> None:
        raise RuntimeError("the object store refused the upload")


class Unreadable(io.RawIOBase):
    @property
    def closed(self) -> bool:  # type: ignore[override]
        raise AttributeError("a proxy whose target is gone")


def test_files_that_raise_when_flushed_or_looked_at_are_passed_over() -> None:
    good = io.BytesIO()
    ending._flush_files_in({"a": Flaky(), "b": Unreadable(), "c": [good]})


def test_a_teardown_that_raises_is_told_and_the_worker_exits_with_the_scripts_status() -> None:
    """In a child process (the teardown takes `__main__` away): its module's teardown raises, it exits 3."""
    code = textwrap.dedent("""
        import os, sys
        from resctl.shim import ending
        def boom(e):
            raise LookupError("the script's object raised when looked at")
        ending.teardown_main = boom
        ending.leave(ending.Ending(3), forked=True)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "tearing down the script's module failed (LookupError" in proc.stderr


def test_a_spinning_thread_of_the_script_does_not_keep_the_worker_from_its_exit(tmp_path: Path) -> None:
    """A CPU-bound daemon thread of the script takes the GIL whenever the teardown waits on a file: the
    teardown's switch interval gives it back within a bounded time, and the file's bytes are flushed."""
    out = tmp_path / "log.txt"
    code = textwrap.dedent(f"""
        import sys, threading, types
        from resctl.shim import ending
        main = types.ModuleType("__main__")
        main.log = open({str(out)!r}, "w", buffering=1 << 20)
        main.log.write("x" * 4096)
        sys.modules["__main__"] = main
        threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()
        ending.leave(ending.Ending(0), forked=True)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == "x" * 4096
