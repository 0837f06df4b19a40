"""The workers' process groups as the agent records them (`ResctlAgent._own_groups`): each forked worker leads
its own group, from the parent's side too, before NVRx 0.6+'s leftover cleanup reads them."""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

from resctl.launch.agent import ResctlAgent


def test_a_worker_still_in_the_launchers_group_is_moved_to_its_own_and_recorded_so() -> None:
    pid = os.fork()
    if pid == 0:  # a worker whose at-fork hook has not run yet: still in the parent's group
        time.sleep(30)
        os._exit(0)
    try:
        assert os.getpgid(pid) == os.getpgid(0)
        agent = SimpleNamespace(_pcontext=SimpleNamespace(pids=lambda: {0: pid}), _children_pgids={os.getpgid(0)})
        ResctlAgent._own_groups(agent)  # type: ignore[arg-type]
        assert os.getpgid(pid) == pid
        assert agent._children_pgids == {pid}  # never the launcher's own group
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_worker_gone_already_is_passed_over() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    agent = SimpleNamespace(_pcontext=SimpleNamespace(pids=lambda: {0: pid}), _children_pgids=set())
    ResctlAgent._own_groups(agent)  # type: ignore[arg-type]
    assert agent._children_pgids == set()
