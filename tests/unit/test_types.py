"""mypy over the package (STYLE: typed through and through; strict for resctl.checkpoint and resctl.shim), with
the pydantic plugin from pyproject, and ruff over the repository with the rules pyproject selects."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_mypy_is_clean() -> None:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"],
                                                       capture_output=True).returncode != 0:
        pytest.fail("mypy is not installed: install the test extras (pip install -e '.[test]')")
    out = subprocess.run([sys.executable, "-m", "mypy", "resctl"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-4000:]


def test_ruff_is_clean() -> None:
    if subprocess.run([sys.executable, "-m", "ruff", "--version"], capture_output=True).returncode != 0:
        pytest.fail("ruff is not installed: install the test extras (pip install -e '.[test]')")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stdout[-4000:]
