"""One console line per recovered fault, for each layer, with counts that match NVRx's own semantics."""

from __future__ import annotations

import importlib.util
import io
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from resctl.launch.launcher_logs import RESTART_MESSAGE, FaultLines, restart_line
from resctl.profile.load import resolve

NVRX_LAUNCHER = Path(importlib.util.find_spec("nvidia_resiliency_ext.fault_tolerance.launcher").origin or "")
ANY_FAILED = "[%s] Worker group %s. %s/%s attempts left; will restart worker group"
MIN_HEALTHY = "{}/{} restart attempts left; restarting worker group..."


def test_the_wordings_are_the_installed_nvrx_launchers() -> None:
    source = NVRX_LAUNCHER.read_text()
    if "_torch_elastic_compat" in source:  # NVRx 0.4: any-failed and min-healthy
        assert '"%s/%s attempts left;"\n                        " will restart worker group"' in source
        assert "restart attempts left; restarting worker group..." in source
    else:  # NVRx 0.6+: any-failed only, an f-string (issue 30)
        assert ('f"{self._remaining_restarts}/{spec.max_restarts} attempts left; "\n'
                '                    f"will restart worker group"') in source
        assert RESTART_MESSAGE.search("[default] Worker group FAILED. 3/3 attempts left; will restart worker group")
    assert 'self._remaining_restarts -= 1' in source  # logged first, then used: the count includes this one


def lines(*records: logging.LogRecord) -> list[str]:
    out = io.StringIO()
    handler = FaultLines(out)
    for r in records:
        handler.emit(r)
    return out.getvalue().splitlines()


def record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("nvrx", logging.INFO, __file__, 1, msg, args or None, None)


FAILED = record("failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", 1, 1, 4242, "python")


@pytest.mark.parametrize("restart", [record(ANY_FAILED, "default", "FAILED", 3, 3), record(MIN_HEALTHY.format(3, 3))],
                         ids=["any-failed", "min-healthy (in-process on)"])
def test_first_of_three_restarts_leaves_two(restart: logging.LogRecord) -> None:
    got = lines(FAILED, restart)
    assert len(got) == 1, got
    assert got[0].startswith("resctl: local rank 1 failed (exit code 1); restarting the workers, 2 of 3 restarts left")


def test_the_last_restart_leaves_none() -> None:
    assert "0 of 1 restarts left" in lines(FAILED, record(ANY_FAILED, "default", "FAILED", 1, 1))[0]
    assert "0 of 1 restarts left" in lines(record(MIN_HEALTHY.format(1, 1)))[0]
    # "0/1 restart attempts left. Exiting..." is no restart
    assert lines(FAILED, record("0/1 restart attempts left. Exiting...")) == []


def test_a_joining_node_is_no_fault() -> None:
    got = lines(record("[%s] Detected %s new nodes from group_rank=%s; will restart worker group", "default", 1, 0))
    assert got == ["resctl: 1 node(s) joined; restarting the workers (no restart used)"]
    assert restart_line("Rendezvous complete", "") is None


def test_an_inprocess_restart_is_one_line_naming_the_failed_rank(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    import torch.distributed as dist

    from resctl.shim import inprocess

    store = dist.TCPStore("127.0.0.1", 0, 1, True, wait_for_workers=False)
    profile = resolve(None, env={}, sets=["inprocess.enabled=true", "inprocess.max_iterations=3"], cwd=tmp_path).profile
    shim = SimpleNamespace(profile=profile, cycle=0, step=7)
    monkeypatch.setitem(os.environ, "RANK", "1")
    inprocess.tell_rank0(store, 0, 0, RuntimeError("boom"))
    monkeypatch.setitem(os.environ, "RANK", "0")  # then the peer whose collective the abort broke
    inprocess.tell_rank0(store, 0, 0, RuntimeError("[gloo] Connection closed by peer [127.0.0.1]:20115"))
    inprocess.tell_rank0(store, 0, 0, ValueError("a second error of its own, later"))
    assert inprocess.restart_line(store, shim, 1) == (
        "resctl: rank 1 failed (RuntimeError: boom); ranks re-run the script in place (in-process restart 1 of 3)")
    # only a peer's error in iteration 1: it is named, as nothing else was
    inprocess.tell_rank0(store, 0, 1, RuntimeError("Connection closed by peer"))
    assert inprocess.restart_line(store, shim, 2).startswith("resctl: rank 0 failed (RuntimeError: Connection closed")
    # nobody raised in iteration 2 (a hang caught by the watchdog): still one line, saying so
    assert "no rank raised" in inprocess.restart_line(store, shim, 3)


def test_max_iterations_counts_restarts_as_the_schema_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """NVRx's RetryController refuses iteration >= max_iterations, the first run being iteration 0;
    `inprocess.max_iterations` is "In-process restarts before handing over to the launcher"."""
    from resctl.shim import inprocess

    monkeypatch.setitem(os.environ, "MASTER_ADDR", "127.0.0.1")
    profile = resolve(None, env={}, sets=["inprocess.enabled=true", "inprocess.max_iterations=3"], cwd=tmp_path).profile
    wrapper = inprocess.build_wrapper(SimpleNamespace(profile=profile, run_dir=None, cycle=0, world_size=1), ("127.0.0.1", 12345))
    controller = wrapper.initialize
    allowed = [i for i in range(10) if i < controller.max_iterations]
    assert len(allowed) - 1 == 3, "three restarts after the first run"


class ProcessExitedException(Exception):
    """The name torch.multiprocessing gives a forked worker's death (matched by name, as NVRx logs it)."""


def _failed(code: int, exc: BaseException | None) -> logging.LogRecord:
    r = record("failed (exitcode: %s) local_rank: %s (pid: %s) of fn: run_script_path (start_method: fork)",
               code, 1, 4242)
    r.exc_info = (type(exc), exc, None) if exc is not None else None
    return r


@pytest.mark.parametrize("failure", [
    _failed(-9, ProcessExitedException("process 1 terminated with signal SIGKILL")),  # a forked worker
    _failed(-9, None),  # an exec'd worker
], ids=["fork", "exec"])
def test_a_killed_rank_reads_the_same_in_both_start_modes(failure: logging.LogRecord) -> None:
    got = lines(failure, record(ANY_FAILED, "default", "FAILED", 3, 3))
    assert got[0].startswith("resctl: local rank 1 failed (terminated by signal SIGKILL); restarting the workers")


def test_an_exit_code_and_a_raised_error_keep_their_wording() -> None:
    fork_exit = _failed(3, ProcessExitedException("process 1 terminated with exit code 3"))
    assert "(exit code 3)" in lines(fork_exit, record(ANY_FAILED, "default", "FAILED", 3, 3))[0]
    raised = _failed(1, RuntimeError("Traceback (most recent call last):\n  ...\nValueError: boom"))
    assert "(ValueError: boom)" in lines(raised, record(ANY_FAILED, "default", "FAILED", 3, 3))[0]
