"""The tests' zygote (tests/zygote.py) gives its children what `subprocess.Popen([sys.executable, script, ...])` would:
their own PID and pipes, the environment, argv, working directory and sys.path[0] asked for, and the interpreter's
own exit (atexit handlers, an uncaught exception's status 1, `sys.exit`'s code, a signal's negative code)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.zygote import Child, zygote

CHILD = textwrap.dedent(
    """
    import atexit, os, sys
    import torch  # already imported in the zygote: no cost here
    atexit.register(lambda: print("atexit", flush=True))
    print("up", os.getpid(), os.environ.get("ZYGOTE_TEST"), sys.argv[1:], os.getcwd(), sys.path[0], flush=True)
    line = sys.stdin.readline().strip()
    if line == "raise":
        raise ValueError("boom")
    if line == "wait":
        sys.stdin.readline()
    sys.exit(int(line))
    """
)


def _start(tmp_path: Path, script: Path) -> Child:
    return zygote().popen([sys.executable, str(script), "a", "b"], env={"ZYGOTE_TEST": "yes", "PATH": os.environ["PATH"]},
                          cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def test_a_child_runs_as_a_fresh_interpreter_would(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    for said, code, tail in (("3", 3, "atexit\n"), ("raise", 1, "ValueError: boom\natexit\n"), ("0", 0, "atexit\n")):
        child = _start(tmp_path, script)
        assert child.stdout is not None and child.stdin is not None
        up = child.stdout.readline().split(maxsplit=2)
        assert up[0] == "up" and int(up[1]) == child.pid != os.getpid()
        assert up[2].strip() == f"yes ['a', 'b'] {tmp_path} {tmp_path}"
        child.stdin.write(said + "\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=60)
        assert child.returncode == code and out.endswith(tail), (said, child.returncode, out[-300:])


def test_a_signalled_child_reports_the_signal_and_run_captures_output(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    child = _start(tmp_path, script)
    assert child.stdout is not None and child.stdin is not None
    assert child.stdout.readline().startswith("up ")
    child.stdin.write("wait\n")
    child.stdin.flush()
    assert child.poll() is None
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=60) == -signal.SIGKILL
    done = zygote().run([sys.executable, str(script)], env={"PATH": os.environ["PATH"]}, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout.startswith("up ") and "invalid literal" in done.stderr
