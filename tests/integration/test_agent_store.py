"""The workers' store is the launcher's (issue 20), with a fresh key space per restart.

A process group made by `env://` reaches the launcher's rendezvous store as under torchrun
(TORCHELASTIC_USE_AGENT_STORE=True, MASTER_PORT = that store), so rank 0 ending first takes no
store away from its peers. Across an in-job restart the store stays; each cycle's keys live under
`/worker/attempt_<N>` (resctl/shim/agent_store.py). Without that, the restarted ranks read the dead
ranks' gloo addresses and failed "connectFullMesh ... Connection refused"; torchrun 2.13 keeps its
shared store across restarts the same way and fails so in about half of the runs here
(docs/compat.md), so its run of the same script is reported, not required.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.jobs import finish, start

pytestmark = pytest.mark.slow

SCRIPT = '''
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
attempt, rank = int(os.environ["TORCHELASTIC_RESTART_COUNT"]), dist.get_rank()
print(f"ATTEMPT {attempt} RANK {rank} SUM {t.item():g} AGENT {os.environ['TORCHELASTIC_USE_AGENT_STORE']}", flush=True)
if attempt == 0 and rank == 1:
    os._exit(1)  # the peer is stopped by the launcher; both start again
if attempt == 0:
    import time; time.sleep(60)
dist.destroy_process_group()
'''


@pytest.fixture(scope="module")
def torchrun(tmp_path_factory: pytest.TempPathFactory) -> str:
    """torchrun's output on the same script, run once for both start modes. Its restarted group can hang in gloo's
    init (its own defect, seen in about half of the runs): what this test reads of it is the first attempt's
    line, so once that is printed torchrun gets 40 s to restart and end, then its process tree is killed and
    what it printed is kept (it is shown beside a failure of resctl's run)."""
    cwd = tmp_path_factory.mktemp("agent-store-torchrun")
    (cwd / "pg_restart.py").write_text(SCRIPT)
    log = cwd / "torchrun.out"
    with log.open("w") as out:
        # --standalone: a free port (torchrun's static default, 29500, may be taken on a shared box)
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                                 "--max-restarts", "1", "pg_restart.py"], cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        # A limit for a hang, not a time: beside two CPU burners torchrun took more than 180 s in all.
        deadline, seen_at = time.monotonic() + 600, None
        while proc.poll() is None and time.monotonic() < deadline:
            if seen_at is None and "ATTEMPT 0 RANK 1" in log.read_text():
                seen_at, deadline = time.monotonic(), min(deadline, time.monotonic() + 40)
            time.sleep(0.5)
        if proc.poll() is None:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
            proc.kill()
            proc.wait()
    return log.read_text()


@pytest.mark.parametrize("worker_start", ["fork", "exec"])
def test_a_restarted_group_meets_in_a_fresh_key_space_of_the_launchers_store(tmp_path: Path, worker_start: str,
                                                                            torchrun: str) -> None:
    (tmp_path / "pg_restart.py").write_text(SCRIPT)
    assert "ATTEMPT 0 RANK 1 SUM 2 AGENT True" in torchrun, torchrun[-3000:]
    code, out = finish(start(["--nproc-per-node", "2", "--max-restarts", "1", "--run-dir", "run", "--set",
                              f"launch.worker_start={worker_start}", "pg_restart.py"], cwd=tmp_path), timeout=600)
    seen = f"\n--- torchrun:\n{torchrun[-3000:]}"
    assert code == 0, out[-3000:] + seen
    for attempt in (0, 1):
        for rank in (0, 1):
            assert f"ATTEMPT {attempt} RANK {rank} SUM 2 AGENT True" in out, out[-3000:]
