"""A clean run's console is as short as torchrun's (+3 resctl lines); the launcher's log goes to the run
directory, `-v` shows it; a recovered fault is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Each line in one write: with PYTHONUNBUFFERED (CI's environment) print's pieces are separate writes, and two
# ranks' pieces met on one line once ("rankrank 0 done"), under torchrun as under resctl.
NOOP = "import os, sys\nsys.stdout.write(f\"rank {os.environ['RANK']} done\\n\")\n"
FAIL_ONCE = """import os, sys
if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
    raise RuntimeError("boom on purpose")
sys.stdout.write(f"rank {os.environ['RANK']} done\\n")
"""


def console(cmd: list[str], cwd: Path) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    return proc.returncode, [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def resctl(tmp_path: Path, script: str, *flags: str) -> tuple[int, list[str]]:
    return console([sys.executable, "-m", "resctl", "run", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"),
                    *flags, script], tmp_path)


def test_a_clean_run_prints_no_more_than_torchrun_plus_three_lines(tmp_path: Path) -> None:
    (tmp_path / "noop.py").write_text(NOOP)
    code, torchrun = console([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "noop.py"], tmp_path)
    assert code == 0, torchrun
    code, lines = resctl(tmp_path, "noop.py")
    assert code == 0, lines
    assert len(lines) <= len(torchrun) + 3, lines
    assert sorted(line for line in lines if "done" in line) == ["rank 0 done", "rank 1 done"]
    assert any(str(tmp_path / "run") in line for line in lines), "where the run directory is"
    assert lines[-1].startswith("resctl: finished in"), "how it ended"
    log = (tmp_path / "run" / "launcher.log").read_text()
    assert "Agent exits with exit code = 0" in log and "rendezvous" in log and "no scheduler found" in log


def test_verbose_shows_the_launcher_log(tmp_path: Path) -> None:
    (tmp_path / "noop.py").write_text(NOOP)
    code, lines = resctl(tmp_path, "noop.py", "-v")
    assert code == 0 and any("Agent exits with exit code = 0" in line for line in lines), lines
    assert any("no scheduler found" in line for line in lines)


def test_a_recovered_fault_is_one_console_line(tmp_path: Path) -> None:
    (tmp_path / "fail_once.py").write_text(FAIL_ONCE)
    code, lines = resctl(tmp_path, "fail_once.py")
    assert code == 0, lines
    faults = [line for line in lines if "boom on purpose" in line and line.startswith("resctl:")]
    assert len(faults) == 1 and faults[0].startswith("resctl: local rank 1 failed (RuntimeError: boom on purpose)"), lines
    assert "restarting the workers, 2 of 3 restarts left" in faults[0]  # the default launch.max_restarts, 3
    # The script's own traceback is on the console, as under torchrun; the launcher's stay in the run dir.
    assert sum(line.startswith("Traceback") for line in lines) == 1, lines
    assert not any(line.startswith("[") for line in lines), lines
    assert "Traceback" in (tmp_path / "run" / "launcher.log").read_text(), "the details are in the run directory"


ALWAYS_FAILS = """import os
if os.environ["RANK"] == "1":
    raise RuntimeError("boom every time")
"""


def test_a_failing_job_counts_its_restarts_the_same_everywhere(tmp_path: Path) -> None:
    """NVRx logs "1/1 attempts left" before using the one restart: after it none is left, and the
    failure summary counts the restart that was made."""
    (tmp_path / "fails.py").write_text(ALWAYS_FAILS)
    code, lines = resctl(tmp_path, "fails.py", "--max-restarts", "1")
    assert code != 0, lines
    restarts = [line for line in lines if "restarting the workers" in line]
    assert len(restarts) == 1 and "restarting the workers, 0 of 1 restarts left" in restarts[0], lines
    assert any(line.startswith("resctl: the job failed") and "after 1 launcher restart(s);" in line
               for line in lines), lines
