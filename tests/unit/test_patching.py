"""Owned, undoable patches: the shim's and the launcher's changes to other libraries go back exactly."""

from __future__ import annotations

import multiprocessing.spawn as mp_spawn
import os
import signal
import types

import torch.distributed as dist

from resctl.launch import adapters as ft_entry
from resctl.patching import Patches
from resctl.profile.schema import Profile
from resctl.shim.runtime import Shim


class Base:
    def hello(self) -> str:
        return "base"


class Child(Base):
    own = 1


def test_patches_restore_own_inherited_and_missing_attributes() -> None:
    module = types.SimpleNamespace(f=len)
    p = Patches("t")
    assert p.set(module, "f", lambda x: 0) is len
    assert p.set(Child, "hello", lambda self: "patched") is Base.hello  # inherited: wrap what callers saw
    assert p.set(Child, "extra", 5) is None
    undone: list[str] = []
    p.on_undo(lambda: undone.append("hook"))
    assert Child().hello() == "patched" and module.f("ab") == 0 and Child.extra == 5
    assert p.applied == ["SimpleNamespace.f", "Child.hello", "Child.extra"]
    p.undo()
    assert module.f is len and Child().hello() == "base" and "hello" not in Child.__dict__
    assert not hasattr(Child, "extra") and undone == ["hook"] and not p


def test_shim_install_is_undone_completely(tmp_path) -> None:
    before = (dist.init_process_group, mp_spawn.get_preparation_data, signal.getsignal(signal.SIGTERM),
              signal.set_wakeup_fd(-1))
    signal.set_wakeup_fd(before[3])
    shim = Shim(Profile(), tmp_path, env={"RANK": "0", "WORLD_SIZE": "1"})
    shim.install()
    try:
        assert dist.init_process_group is not before[0]
        assert mp_spawn.get_preparation_data is before[1]  # spawn children re-import the script, as under torchrun
        assert signal.getsignal(signal.SIGTERM) is not before[2]
        assert "init_process_group" in " ".join(shim.patches.applied)
    finally:
        shim.uninstall()
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    assert (dist.init_process_group, mp_spawn.get_preparation_data, signal.getsignal(signal.SIGTERM), wakeup) == before


def test_launcher_adapters_apply_once_and_undo(monkeypatch, tmp_path) -> None:
    from nvidia_resiliency_ext.fault_tolerance import launcher
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

    monkeypatch.setenv("RESCTL_STOP_FILE", str(tmp_path / "stop"))
    ft_entry.undo_adapters()
    agent_cls, clock, monitor_run = launcher.LocalElasticAgent, launcher.time, RankMonitorServer.run
    applied = ft_entry.apply_adapters()
    try:
        assert "nvidia_resiliency_ext.fault_tolerance.launcher.LocalElasticAgent" in applied and "RankMonitorServer.run" in applied
        assert ft_entry.apply_adapters() == [], "adapters apply once"
        assert launcher.time is not clock and launcher.time.monotonic is clock.monotonic
    finally:
        ft_entry.undo_adapters()
    assert (launcher.LocalElasticAgent, launcher.time, RankMonitorServer.run) == (agent_cls, clock, monitor_run)
    assert os.environ["RESCTL_STOP_FILE"] == str(tmp_path / "stop")
