"""`resctl run` with the launcher's interpreter started before the plan (resctl.launch.prestart): a job behaves as
when the launcher starts afresh, whatever the plan's environment; a CLI that launches nothing leaves nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from resctl.launch import prestart
from resctl.launch.launcher_logs import LOG_FILE

pytestmark = pytest.mark.slow

SCRIPT = """
import os
print("ENV " + " ".join(f"{k}={os.environ.get(k)}" for k in ("OMP_NUM_THREADS", "NCCL_DEBUG", "RESCTL_PRESTART_FD",
                                                                "PYTHONUNBUFFERED")), flush=True)
"""
EARLY = "was started before the plan"
AGAIN = "starts again with the plan's environment"


def _run(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, str]:
    script = tmp / "env.py"
    script.write_text(SCRIPT)
    run_dir = tmp / "run"
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_NUM_THREADS", "NCCL_DEBUG", "RESCTL_PRESTART", "PYTHONUNBUFFERED")}
    proc = subprocess.run([sys.executable, "-m", "resctl", "run", "--nproc-per-node", "1", "--run-dir", str(run_dir),
                           *args, str(script)], cwd=tmp, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout, (run_dir / LOG_FILE).read_text()


@pytest.mark.parametrize(("profile", "env", "worker_sees", "log"), [
    ("", {}, "OMP_NUM_THREADS=None NCCL_DEBUG=None", EARLY),
    ('[launch.env]\nNCCL_DEBUG = "WARN"\n', {}, "NCCL_DEBUG=WARN", EARLY),  # read by NCCL, long after torch's import
    ('[launch.env]\nOMP_NUM_THREADS = "3"\n', {}, "OMP_NUM_THREADS=3", AGAIN),  # read when torch loads OpenMP
    ('[launch]\nworker_start = "exec"\n', {}, "PYTHONUNBUFFERED=None", EARLY),  # dropped for exec'd workers
    ('[launch]\nworker_start = "exec"\n', {"PYTHONUNBUFFERED": "1"}, "PYTHONUNBUFFERED=1", EARLY),  # the user's kept
    ("", {"RESCTL_PRESTART": "0"}, "OMP_NUM_THREADS=None", None),
], ids=["default", "late-variable", "early-variable", "exec", "exec-unbuffered", "off"])
def test_the_plan_reaches_the_workers_as_from_a_fresh_launcher(
    tmp_path: Path, profile: str, env: dict[str, str], worker_sees: str, log: str | None
) -> None:
    args = []
    if profile:
        (tmp_path / "p.toml").write_text(profile)
        args = ["-p", str(tmp_path / "p.toml")]
    out, launcher_log = _run(tmp_path, *args, env=env)
    line = next(x for x in out.splitlines() if x.startswith("ENV "))
    assert worker_sees in line and "RESCTL_PRESTART_FD=None" in line, line
    for said in (EARLY, AGAIN):
        assert (said in launcher_log) is (said == log), launcher_log[-2000:]


def test_a_run_that_fails_before_launch_leaves_no_waiting_interpreter(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[launch]\nmax_restarts = -4\n")
    (tmp_path / "x.py").write_text("")
    cli = subprocess.Popen([sys.executable, "-m", "resctl", "run", "-p", str(bad), "x.py"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    waiting: list[psutil.Process] = []
    while cli.poll() is None:  # the waiting interpreter, seen while the CLI still runs
        try:
            waiting += [c for c in psutil.Process(cli.pid).children() if prestart.AWAIT in c.cmdline() and c not in waiting]
        except psutil.Error:
            pass
        time.sleep(0.01)
    out, err = cli.communicate()
    assert cli.returncode == 2 and "max_restarts" in err and "Traceback" not in err, err
    assert waiting, "a waiting interpreter was started"
    gone, alive = psutil.wait_procs(waiting, timeout=60)
    assert not alive, f"still waiting after the CLI left: {alive}"
    assert out == ""
