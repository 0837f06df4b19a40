"""Test isolation: no stray RESCTL_* or scheduler variables from the developer's shell, temp HOME."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCHEDULER_VARS = ("SLURM_", "JOB_COMPLETION_INDEX", "PET_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                  "LOCAL_RANK", "TORCHELASTIC_", "FT_", "KUBERNETES_", "POD_NAMESPACE", "GROUP_RANK")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--launch-rendezvous", choices=("nvrx", "resctl"), default=None,
                     help="run every job with this launch.rendezvous (RESCTL_LAUNCH_RENDEZVOUS, set after the "
                          "isolation below): the multi-node tests against resctl's rendezvous, issue 25")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for name in list(os.environ):
        if name.startswith("RESCTL_") or name.startswith(SCHEDULER_VARS):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    rendezvous = request.config.getoption("--launch-rendezvous")
    if rendezvous:
        monkeypatch.setenv("RESCTL_LAUNCH_RENDEZVOUS", rendezvous)


@pytest.fixture
def resctl_cmd() -> list[str]:
    return [sys.executable, "-m", "resctl"]
