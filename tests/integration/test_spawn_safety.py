"""A spawned child (NVRx's persistent checkpoint writer starts one) must not run the user's script again.

The script below has no `if __name__ == "__main__":` guard, as many training scripts do not: every
time it executes it appends a line to a file. Under `resctl run` it starts a spawn-context child,
which by default would re-import the main module (the script) as `__mp_main__`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.jobs import LOCAL_PROFILE, finish, start

pytestmark = pytest.mark.slow

SCRIPT = '''
import multiprocessing, os, sys
with open(sys.argv[1], "a") as fh:
    fh.write(f"{os.getpid()}\\n")
child = multiprocessing.get_context("spawn").Process(target=os.getpid)
child.start()
child.join()
assert child.exitcode == 0, child.exitcode
'''


@pytest.mark.parametrize("worker_start", ["fork", "exec"])
def test_spawned_children_do_not_rerun_the_script(tmp_path: Path, worker_start: str) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(SCRIPT)
    runs = tmp_path / "runs.txt"
    code, out = finish(start(["-p", str(LOCAL_PROFILE), "--nproc-per-node", "1", "--run-dir", str(tmp_path / "run"),
                              "--set", f'launch.worker_start="{worker_start}"', str(script), str(runs)], cwd=tmp_path))
    assert code == 0, out[-3000:]
    assert len(runs.read_text().splitlines()) == 1, "the script ran more than once in one worker"
