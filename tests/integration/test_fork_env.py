"""Forked workers see what torchrun's exec'd workers get from the environment (threads first)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPT = """
import os, torch
print(f"rank={os.environ['RANK']} threads={torch.get_num_threads()} interop={torch.get_num_interop_threads()} "
      f"omp={os.environ.get('OMP_NUM_THREADS')} cuda_init={torch.cuda.is_initialized()}", flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _report(cmd: list[str], cwd: Path, env: dict[str, str]) -> list[str]:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # Found anywhere in the output, not per line: two workers printing at the same instant to the one
    # stdout they share can land on one line (the text and its newline are separate writes).
    return sorted(re.findall(r"rank=\d+ threads=\d+ interop=\d+ omp=\S+? cuda_init=(?:True|False)", out))


@pytest.mark.parametrize("omp", [None, "2"], ids=["launcher-sets-omp", "user-sets-omp"])
def test_forked_workers_get_torchruns_thread_counts(tmp_path: Path, omp: str | None) -> None:
    script = tmp_path / "threads.py"
    script.write_text(SCRIPT)
    env = _env(**({"OMP_NUM_THREADS": omp} if omp else {}))
    torchrun = _report([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script)], tmp_path, env)
    resctl = _report([sys.executable, "-m", "resctl", "run", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "run"),
                      str(script)], tmp_path, env)
    assert len(torchrun) == 2 and resctl == torchrun
    assert all("cuda_init=False" in line for line in resctl)
    if omp is None:
        assert all("threads=1 " in line for line in resctl), "torchrun's OMP_NUM_THREADS=1 for 2 workers a node"


def test_omp_threads_parsing() -> None:
    from resctl.shim.fork_env import omp_threads

    assert omp_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert omp_threads({"OMP_NUM_THREADS": "4,2"}) == 4  # nested levels: the outer one
    for bad in ("", "0", "-1", "two"):
        assert omp_threads({"OMP_NUM_THREADS": bad}) is None
    assert omp_threads({}) is None
