"""A spawned child re-imports the script as `__mp_main__`, exactly as under torchrun: the script's
unguarded top level runs again in the child, its guarded part does not, and the child finds the
script's functions. (resctl used to keep spawned children off the script, which broke `Pool.map` of a
script-defined function; NVRx's persistent checkpoint writer, the reason, is not resctl's any more.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = '''
import multiprocessing, os, sys
with open(sys.argv[1], "a") as fh:
    fh.write(f"{__name__}\\n")


def pid(_):
    return os.getpid()


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.map(pid, [0])[0] != os.getpid()
'''


@pytest.mark.parametrize("launcher", ["torchrun", "fork", "exec"])
def test_spawned_children_import_the_script_as_under_torchrun(tmp_path: Path, launcher: str) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    runs = tmp_path / "runs.txt"
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1", str(script), str(runs)]
    else:
        cmd = [sys.executable, "-m", "resctl", "run", "--nproc-per-node", "1", "--max-restarts", "0",
               "--run-dir", str(tmp_path / "run"), "--set", f'launch.worker_start="{launcher}"', str(script), str(runs)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert sorted(runs.read_text().split()) == ["__main__", "__mp_main__"]
