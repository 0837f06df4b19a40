"""A worker's end tears the script's module down as `python script.py` does, forked or exec'd.

A forked worker leaves by `os._exit` (resctl.shim.ending), so it used to skip what `Py_Finalize`
does after atexit: a file the script opened at module level and never closed lost what it had
buffered (0 bytes on disk where torchrun's workers wrote it all), and a module-level object's
`__del__` never ran. The same script runs under torchrun and resctl (fork and exec) here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.jobs import torchrun

pytestmark = pytest.mark.slow

SCRIPT = """
import os, sys

RANK = os.environ["RANK"]
OUT = sys.argv[1]
log = open(os.path.join(OUT, f"flat.{RANK}"), "w")  # never closed
log.write("written at module level\\n" * 3)


class Sink:
    def __init__(self, path):
        self.files = [open(path, "w")]  # never closed, two objects down

    def __del__(self):
        print(f"TEARDOWN rank={RANK} del ran, os is {type(os).__name__}", flush=True)


class Cyclic:  # garbage only a collection finds (a forked worker's gc.freeze() must leave the script's own in sight)
    def __init__(self):
        self.me = self

    def __del__(self):
        print(f"TEARDOWN rank={RANK} cycle collected", flush=True)


sink = Sink(os.path.join(OUT, f"nested.{RANK}"))
cycle = Cyclic()
sink.files[0].write("written through an object\\n")
print(f"OUT rank={RANK} main returns", flush=True)
"""


def _run(how: str, script: Path, out: Path, cwd: Path) -> str:
    out.mkdir()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    if how == "torchrun":
        proc = torchrun(["--nproc-per-node", "2", str(script), str(out)], cwd=cwd, env=env, timeout=240)
    else:
        start = ["--set", 'launch.worker_start="exec"'] if how == "exec" else []
        proc = subprocess.run([sys.executable, "-m", "resctl", "run", "--nproc-per-node", "2", "--max-restarts", "0",
                               "--run-dir", str(cwd / f"run-{how}"), *start, str(script), str(out)],
                              cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("how", ["torchrun", "fork", "exec"])
def test_unclosed_files_are_flushed_and_module_objects_finalized(tmp_path: Path, how: str) -> None:
    script = tmp_path / "teardown.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out-{how}"
    console = _run(how, script, out, tmp_path)
    for rank in (0, 1):
        assert (out / f"flat.{rank}").read_text() == "written at module level\n" * 3, how
        assert (out / f"nested.{rank}").read_text() == "written through an object\n", how
        assert f"TEARDOWN rank={rank} del ran, os is module" in console, console[-3000:]
        assert f"TEARDOWN rank={rank} cycle collected" in console, console[-3000:]
