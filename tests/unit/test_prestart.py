"""resctl.launch.prestart: the launcher's interpreter started before the plan (issue 43, the no-op job's start)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from resctl.launch import prestart
from resctl.profile import contract


@pytest.mark.parametrize(("argv", "env", "want"), [
    (["run", "train.py"], {}, True),
    (["run", "--nproc-per-node", "2", "train.py", "--lr", "3"], {}, True),
    (["run", "--dry-run", "train.py"], {}, False),
    (["run", "--help"], {}, False),
    (["run", "train.py", "-h"], {}, False),  # conservative: a script's own -h also starts none
    (["report", "runs/x"], {}, False),
    ([], {}, False),
    (["run", "train.py"], {contract.PRESTART: "0"}, False),
    (["run", "train.py"], {contract.PRESTART: "1"}, True),
])
def test_only_a_run_that_launches_starts_one_early(argv: list[str], env: dict[str, str], want: bool) -> None:
    assert prestart.wanted(argv, env) is want


def test_the_waiting_interpreter_starts_with_what_a_default_plan_gives_the_launcher() -> None:
    env = prestart.expected_env({"PATH": "/bin"}, 123)
    assert env == {"PATH": "/bin", contract.RUN_PID: "123", contract.PRELOAD: "1", "PYTHONUNBUFFERED": "1",
                   contract.ADDED_ENV: "PYTHONUNBUFFERED"}
    own = prestart.expected_env({"PYTHONUNBUFFERED": "x"}, 1)
    assert own["PYTHONUNBUFFERED"] == "x" and contract.ADDED_ENV not in own  # the user's, as the plan keeps it


@pytest.mark.parametrize(("name", "late"), [
    (contract.PLAN, True), (contract.VERBOSE, True), ("NCCL_DEBUG", True), ("FI_PROVIDER", True), ("TORCH_NCCL_BLOCKING_WAIT", True),
    ("TORCHELASTIC_SIGNALS_TO_HANDLE", True), ("MASTER_PORT", True), ("GROUP_RANK", True),
    ("PYTHONUNBUFFERED", True),
    ("OMP_NUM_THREADS", False), ("TORCH_CPP_LOG_LEVEL", False), ("LD_PRELOAD", False),
    ("CUDA_VISIBLE_DEVICES", False), ("PYTHONPATH", False), ("RESCTL_LAUNCH_NNODES_X", False),
])
def test_only_variables_read_after_torchs_import_may_change_without_a_fresh_start(name: str, late: bool) -> None:
    assert prestart.late_read(name) is late


def test_changed_names_added_removed_and_altered_variables() -> None:
    assert prestart.changed({"A": "1", "B": "2", "C": "3"}, {"A": "1", "B": "9", "D": "4"}) == {"B", "C", "D"}


def test_a_cli_that_starts_no_launcher_leaves_the_waiting_interpreter_to_exit_quietly(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """`begin` starts a real interpreter (torch imported while it waits); the CLI's end (its pipe closed) ends it."""
    monkeypatch.delenv(contract.PRESTART, raising=False)
    prestart.begin(["run", "train.py"])
    process, fd = prestart._Warm.process, prestart._Warm.write_fd
    assert process is not None and fd >= 0
    try:
        time.sleep(0.5)
        assert process.poll() is None, "it waits for the plan"
        os.close(fd)  # what the CLI's exit does
        assert process.wait(timeout=120) == 0
    finally:
        prestart._Warm.process, prestart._Warm.write_fd = None, -1
        if process.poll() is None:
            process.kill()
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_no_waiting_interpreter_means_the_caller_starts_the_launcher() -> None:
    assert prestart._Warm.process is None
    assert prestart.hand_over([sys.executable, "-m", prestart.ENTRY], ["--x"], {}) is None


def test_a_dead_waiting_interpreter_is_not_handed_the_plan() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    prestart._Warm.process, prestart._Warm.write_fd = dead, write_fd
    assert prestart.hand_over([sys.executable, "-m", prestart.ENTRY], ["--x"], {}) is None
    assert prestart._Warm.process is None
    with pytest.raises(OSError):
        os.fstat(write_fd)  # closed: the pipe does not outlive the hand-over
