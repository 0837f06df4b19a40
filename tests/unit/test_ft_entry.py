"""Version adapters applied before NVRx's launcher runs."""

from __future__ import annotations

import importlib

from resctl.launch import adapters as ft_entry


def test_adapters_bridge_the_installed_versions() -> None:
    ft_entry.undo_adapters()
    ft_entry.apply_adapters()
    spawn = importlib.import_module("torch.multiprocessing.spawn")
    err = spawn.ProcessExitedException("killed", error_index=1, error_pid=4242, exit_code=-9, signal_name="SIGKILL")
    assert err.pid == 4242

    from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api

    failure = {0: object()}
    assert api.RunResult(state=api.WorkerState.UNHEALTHY, failures=failure).is_failed()  # type: ignore[arg-type]
    assert api.RunResult(state=api.WorkerState.FAILED).is_failed()
    assert not api.RunResult(state=api.WorkerState.UNHEALTHY).is_failed()
    assert not api.RunResult(state=api.WorkerState.SUCCEEDED).is_failed()
    assert ft_entry.apply_adapters() == [], "adapters apply once"
    ft_entry.undo_adapters()
    assert "pid" not in spawn.ProcessException.__dict__, "undo removes the alias"
