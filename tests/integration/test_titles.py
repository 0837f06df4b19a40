"""`ps`/`pgrep` tell the launcher, the rank monitors and each worker apart (forked workers share the
launcher's command line, so their titles are all that does). The store host's launcher serves its rendezvous
store from a keeper process (`resctl-store`, resctl.launch.store_keeper), so no thread of the launcher's is
torch's store server (a worker forked while that thread resolved a client's address hung in its first lookup),
and the keeper leaves with the job."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.integration.jobs import events, finish, start, wait_for
from tests.integration.test_recovery import job

pytestmark = pytest.mark.slow


def test_launcher_monitors_and_workers_have_their_own_titles(tmp_path: Path) -> None:
    proc = start(job(tmp_path, "titles", 2, steps=2000, step_time=0.05), cwd=tmp_path)
    try:
        wait_for(lambda: len({e["rank"] for e in events(tmp_path / "titles") if e["kind"] == "step"}) == 2,
                 120, "both workers to train", proc)
        tree = psutil.Process(proc.pid).children(recursive=True)
        titles = sorted(" ".join(" ".join(p.cmdline()).split()) for p in tree if p.is_running())
        assert "resctl-launcher train_ckpt.py" in titles, titles
        assert {"resctl-worker rank=0 local=0 train_ckpt.py", "resctl-worker rank=1 local=1 train_ckpt.py"} <= set(titles)
        assert {"resctl-rank-monitor local=0", "resctl-rank-monitor local=1"} <= set(titles), titles
        names = {Path(f"/proc/{p.pid}/comm").read_text().strip() for p in tree if p.is_running()}  # plain pgrep
        assert {"resctl-launcher", "resctl-worker r", "resctl-rank-mon", "resctl-store"} <= names, names
        launcher = next(p for p in tree if p.cmdline()[0].startswith("resctl-launcher"))
        keepers = [p for p in launcher.children() if p.cmdline()[0] == "resctl-store"]
        assert len(keepers) == 1, titles
        threads = {Path(f"/proc/{launcher.pid}/task/{t.id}/comm").read_text().strip() for t in launcher.threads()}
        assert not {t for t in threads if t.startswith("pt_tcpstore")}, threads
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        finish(proc, timeout=60)
    wait_for(lambda: not keepers[0].is_running() or keepers[0].status() == psutil.STATUS_ZOMBIE, 10,
             "the store's keeper to leave with its launcher")
