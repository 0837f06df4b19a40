from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.jobs import finish, snapshot_job, start


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final weights of a fault-free 2-rank run of examples/train_snapshot.py (40 steps): every
    recovered run of the same job must match them bit for bit."""
    tmp = tmp_path_factory.mktemp("reference")
    code, out = finish(start(snapshot_job(tmp, "ref"), cwd=tmp))
    assert code == 0, out[-3000:]
    return tmp / "ref-final.pt"
