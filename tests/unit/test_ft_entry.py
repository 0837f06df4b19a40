"""resctl's agent installed before NVRx's launcher runs, and undone."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from resctl.launch import adapters, agent


def test_the_launcher_builds_resctls_agent_and_undo_puts_nvrxs_back() -> None:
    from nvidia_resiliency_ext.fault_tolerance import launcher

    adapters.undo_adapters()
    original, clock = launcher.LocalElasticAgent, launcher.time
    applied = adapters.apply_adapters()
    try:
        assert launcher.LocalElasticAgent is agent.ResctlAgent and issubclass(agent.ResctlAgent, original)
        assert isinstance(launcher.time, agent.LauncherClock) and launcher.time.monotonic is clock.monotonic
        assert "nvidia_resiliency_ext.fault_tolerance.launcher.LocalElasticAgent" in applied
        assert adapters.apply_adapters() == [], "adapters apply once"
    finally:
        adapters.undo_adapters()
    assert (launcher.LocalElasticAgent, launcher.time) == (original, clock)


def test_a_worker_killed_by_a_signal_gets_the_pid_nvrx_04_reads() -> None:
    spawn = importlib.import_module("torch.multiprocessing.spawn")
    err = spawn.ProcessExitedException("killed", error_index=1, error_pid=4242, exit_code=-9, signal_name="SIGKILL")

    def failing_join(timeout: float | None = None, grace_period: float | None = None) -> None:
        raise err

    pc = SimpleNamespace(join=failing_join, sentinels={}, processes=[])
    pcontext = SimpleNamespace(_pc=pc)
    seams = agent._ProcessContextSeams(SimpleNamespace(stop_file="x", stop_timeout=lambda: 5.0), pcontext)  # type: ignore[arg-type]
    with pytest.raises(spawn.ProcessExitedException) as raised:
        pc.join(-1)
    assert raised.value.pid == 4242 and seams is not None
    assert "pid" not in spawn.ProcessException.__dict__, "torch's class is left alone"


@pytest.mark.parametrize("state,failures,failed", [("UNHEALTHY", {0: object()}, True), ("FAILED", {}, True),
                                                  ("UNHEALTHY", {}, False), ("SUCCEEDED", {}, False)])
def test_a_group_that_used_up_its_restarts_is_a_failure(state: str, failures: dict, failed: bool) -> None:
    try:  # NVRx 0.4/0.5 carry their own copy of torch elastic; 0.6+ use torch's
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api
    except ImportError:
        from torch.distributed.elastic.agent.server import api  # type: ignore[no-redef]

    class Ended(agent.ResctlAgent):
        def __init__(self) -> None:  # no launcher around it: only `run`'s verdict is under test
            pass

    base = agent.ResctlAgent.__mro__[1]
    result = api.RunResult(state=getattr(api.WorkerState, state), failures=failures)
    original = base.run
    try:
        base.run = lambda self, *a, **k: result
        assert Ended().run().is_failed() is failed
    finally:
        base.run = original


def test_the_launchers_exit_code_says_which_signal_stopped_it() -> None:
    stop = agent.JobStop()
    assert stop.exit_code(1) == 1 and stop.exit_code(0) == 0
    stop.signum = 15
    assert stop.exit_code(1) == 143 and stop.exit_code(0) == 0
    stop.peer = True
    assert stop.exit_code(0) == 143
