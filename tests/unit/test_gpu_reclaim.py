"""resctl.launch.gpu_reclaim: after a restart's stop, the stopped workers' GPU memory, measured from each GPU's use
before the first workers (NVRx 0.6+'s absolute 512 MB made every restart on an H200 wait its 50 s timeout). NVML is
absent here: a reader stands in for it, with the H200's idle use."""

from __future__ import annotations

import pytest

from resctl.launch import gpu_reclaim

IDLE_H200 = 580.0  # MB in use on an idle card: above NVRx's absolute 512 MB


class Card:
    """Used MB per device over a fake clock: `freed_at` seconds after the stop the workers' memory is gone."""

    def __init__(self, idle: list[float], held: float, freed_at: float) -> None:
        self.idle, self.held, self.freed_at, self.now = idle, held, freed_at, 0.0

    def read(self, device: int) -> float:
        return self.idle[device] + (self.held if self.now < self.freed_at else 0.0)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_card_busier_than_512_mb_when_idle_is_reclaimed_once_the_workers_memory_is_gone() -> None:
    card = Card([IDLE_H200, IDLE_H200 + 20], held=40_000, freed_at=0.3)
    base = gpu_reclaim.baseline(lambda d: card.idle[d], 2)  # before the first workers: the idle card
    assert base == [IDLE_H200, IDLE_H200 + 20]
    waited = gpu_reclaim.wait(card.read, base, 512, 50, clock=lambda: card.now, sleep=card.sleep)
    assert waited is not None and 0.3 <= waited < 0.3 + 2 * gpu_reclaim.POLL  # not NVRx's 50 s, nor a 2 s poll


def test_memory_never_given_back_waits_the_whole_timeout_then_goes_on() -> None:
    card = Card([IDLE_H200], held=40_000, freed_at=float("inf"))
    assert gpu_reclaim.wait(card.read, [IDLE_H200], 512, 5, clock=lambda: card.now, sleep=card.sleep) is None
    assert 5 <= card.now < 5 + 2 * gpu_reclaim.POLL


@pytest.mark.parametrize(("used", "want"), [
    ([600.0, 700.0], True), ([1100.0, 700.0], True), ([1113.0, 700.0], False), ([None, 700.0], True),
])
def test_within_the_tolerance_of_each_cards_own_baseline(used: list[float | None], want: bool) -> None:
    assert gpu_reclaim.reclaimed(used, [600.0, 650.0], 512) is want


def test_no_baseline_without_a_reader_or_a_readable_card() -> None:
    assert gpu_reclaim.baseline(None, 1) is None
    assert gpu_reclaim.baseline(lambda d: None if d == 1 else 10.0, 2) is None
    assert gpu_reclaim.baseline(lambda d: 10.0, 0) is None
    assert gpu_reclaim.nvml_reader() is None  # this machine has no NVML: NVRx's own wait would run


@pytest.mark.launcher
def test_the_agent_waits_from_the_baseline_and_leaves_nvrxs_wait_where_it_has_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from nvidia_resiliency_ext.fault_tolerance import launcher

    from resctl.launch.agent import ResctlAgent

    if not hasattr(launcher.LocalElasticAgent, "_wait_for_gpu_memory_reclaim"):
        pytest.skip("NVRx 0.4/0.5 have no GPU memory wait")
    calls: list[int] = []
    monkeypatch.setattr(launcher.LocalElasticAgent, "_wait_for_gpu_memory_reclaim",
                        lambda self, n: calls.append(n))
    agent = object.__new__(ResctlAgent)
    agent._ft_cfg = SimpleNamespace(gpu_memory_tolerance_mb=512.0, gpu_memory_reclaim_timeout=50.0)
    agent._gpu_baseline = None
    agent._wait_for_gpu_memory_reclaim(1)
    assert calls == [1]  # no baseline (no NVML): NVRx's own wait
    card = Card([IDLE_H200], held=40_000, freed_at=0.0)
    monkeypatch.setattr(gpu_reclaim, "nvml_reader", lambda: card.read)
    agent._gpu_baseline = [IDLE_H200]
    agent._wait_for_gpu_memory_reclaim(1)
    assert calls == [1]  # resctl's: the idle H200 counts as reclaimed at once
