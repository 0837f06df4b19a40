"""Health -> placement on a real two-node Slurm (slurm_cluster.py): examples/slurm/train.sbatch, unchanged,
with the cluster preflight and health.keep_out = "slurm". Node n2 hangs before it joins (a stand-in for a
node whose network or runtime is broken: the `RESCTL` command the kit runs waits there, once); the
preflight on n1 names it broken, drains it (`scontrol update nodename=n2 state=drain reason="resctl: ..."`)
and requeues the job, which Slurm starts again on n1 alone (`sbatch -N 1-2 --spread-job`: as many nodes as are up) and which trains to the end."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.slurm_cluster import SlurmCluster, _free_port, missing
from tests.integration.test_slurm_kit import PROFILE, SBATCH, SCRIPT, wait_for

pytestmark = pytest.mark.slow

HANG_ON_N2 = """#!/bin/sh
# The kit's RESCTL command: on n2, the first `resctl run` hangs (a node that never joins), once.
if [ "$SLURMD_NODENAME" = n2 ] && [ "$1" = run ] && [ ! -e "{work}/n2-hung" ]; then
    touch "{work}/n2-hung"; exec sleep 120
fi
exec {python} -m resctl "$@"
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def test_a_node_that_fails_the_preflight_is_drained_and_the_job_requeued_without_it(slurm: SlurmCluster,
                                                                                     tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    slurm.wait_idle(60)  # both nodes up, so `-N 1-2` is given both
    wrapper = work / "resctl.sh"
    wrapper.write_text(HANG_ON_N2.format(work=work, python=sys.executable))
    wrapper.chmod(0o755)
    env = {**slurm.env, "PATH": f"{Path(sys.executable).parent}:{slurm.env.get('PATH', '')}",
           "RESCTL": str(wrapper), "PROFILE": str(PROFILE), "SCRIPT": str(SCRIPT), "DOCTOR": "0",
           "RESCTL_CHECKPOINT_DIR": str(work / "ckpt"), "RESCTL_LAUNCH_RUN_DIR": str(work / "run"),
           "RESCTL_LAUNCH_RDZV_PORT": str(_free_port()), "RESCTL_LAUNCH_PREFLIGHT": "cluster",
           "RESCTL_HEALTH_KEEP_OUT": "slurm", "RESCTL_HEALTH_PREFLIGHT_TIMEOUT": "15s",
           "RESCTL_HEALTH_PREFLIGHT_PORT": str(_free_port()),
           # Two "nodes" sharing two cores: only their one link and matmul to compare; judge loosely.
           "RESCTL_HEALTH_PREFLIGHT_MARGIN": "4",
           "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(["sbatch", "--parsable", "--gpus-per-node=0", "-N", "2", "--requeue", f"--chdir={work}",
                          f"--output={work}/out.log", "--open-mode=append", str(SBATCH), "--steps", "20"],
                         env=env, capture_output=True, text=True, timeout=30, check=True).stdout
    job = out.strip().split(";")[0]
    began = time.monotonic()
    wait_for("n2 drained by resctl", lambda: "resctl" in slurm.run("sinfo", "-h", "-n", "n2", "-o", "%E %T"),
             120, slurm, work, job)
    state = slurm.run("sinfo", "-h", "-n", "n2", "-o", "%E|%T")
    drained = time.monotonic() - began
    wait_for("the requeue", lambda: int(slurm.job(job).get("Restarts", "0")) >= 1, 60, slurm, work)
    requeued = slurm.job(job)
    log = (work / "out.log").read_text()
    slurm.run("scancel", job)  # CI time: the rerun on the returned node is the kit test's requeue path
    slurm.run("scontrol", "update", "nodename=n2", "state=resume")
    assert "drain" in state.lower() and "did not join" in state, state
    assert requeued["JobState"] in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "COMPLETING"), requeued
    assert "drained Slurm node n2" in log and "requeued Slurm job" in log, log[-3000:]
    print(f"n2 drained {drained:.0f} s after the submission (sinfo: {state.strip()}); job {job} requeued "
          f"({requeued['JobState']}/{requeued.get('Reason')})")
