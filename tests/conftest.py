"""Test isolation: no stray RESCTL_* or scheduler variables from the developer's shell, temp HOME."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCHEDULER_VARS = ("SLURM_", "JOB_COMPLETION_INDEX", "PET_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                  "LOCAL_RANK", "TORCHELASTIC_", "FT_", "KUBERNETES_", "POD_NAMESPACE", "GROUP_RANK")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("RESCTL_") or name.startswith(SCHEDULER_VARS):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


@pytest.fixture
def resctl_cmd() -> list[str]:
    return [sys.executable, "-m", "resctl"]
