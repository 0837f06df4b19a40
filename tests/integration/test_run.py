"""`resctl run` end to end: real ft_launcher, real workers (gloo on CPU), real signals."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.integration.jobs import (
    EXAMPLES,
    LOCAL_PROFILE,
    assert_same_weights,
    events,
    finish,
    last_step,
    snapshot_job,
    start,
    wait_for,
    worker_pid,
)

pytestmark = pytest.mark.slow
SCRIPT = str(EXAMPLES / "train_snapshot.py")


@pytest.mark.parametrize("worker_start", ["fork", "exec"])
def test_unmodified_script_survives_an_outside_sigkill(tmp_path: Path, reference: Path, worker_start: str) -> None:
    proc = start(snapshot_job(tmp_path, "kill", extra=("--set", f'launch.worker_start="{worker_start}"')), cwd=tmp_path)
    run_dir = tmp_path / "kill"
    wait_for(lambda: last_step(run_dir, 1) >= 12, 120, "rank 1 to reach step 12", proc)
    pid = worker_pid(run_dir, rank=1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    code, out = finish(proc)
    assert code == 0, out[-3000:]
    assert "resumed from" in out
    starts = [e for e in events(run_dir) if e["kind"] == "start"]
    assert {e["cycle"] for e in starts} == {0, 1}, "the launcher restarted the workers once, in-job"
    assert_same_weights(tmp_path / "kill-final.pt", reference)


def test_a_hung_worker_is_detected_by_heartbeats_and_restarted(tmp_path: Path, reference: Path) -> None:
    hb = ["--set", "heartbeat.timeout=4s", "--set", "heartbeat.check_interval=1s"]
    proc = start(snapshot_job(tmp_path, "hang", extra=tuple(hb)), cwd=tmp_path)
    run_dir = tmp_path / "hang"
    wait_for(lambda: last_step(run_dir, 1) >= 12, 120, "rank 1 to reach step 12", proc)
    pid = worker_pid(run_dir, rank=1)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    code, out = finish(proc)
    assert code == 0, out[-3000:]
    assert any(e["kind"] == "start" and e["cycle"] == 1 for e in events(run_dir))
    assert_same_weights(tmp_path / "hang-final.pt", reference)


def test_a_job_that_always_fails_stops_after_max_restarts_with_a_summary(tmp_path: Path) -> None:
    args = snapshot_job(tmp_path, "broken", extra=("--max-restarts", "1")) + ["--fail-always"]
    code, out = finish(start(args, cwd=tmp_path))
    assert code != 0
    summary = out[out.index("resctl: the job failed"):]
    assert "after 1 launcher restart(s)" in summary
    assert "RuntimeError: this job is broken on purpose (--fail-always)" in summary
    assert "rank 0, 1" in summary
    assert len(summary.splitlines()) < 25, "the summary fits on one screen"


def test_two_nodes_rendezvous_over_loopback(tmp_path: Path, reference: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    common = ["-p", str(LOCAL_PROFILE), "--nnodes", "2", "--nproc-per-node", "1",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes", "--local-addr", "127.0.0.1"]
    job = [SCRIPT, "--steps", "40", "--step-time", "0.02", "--snapshot", str(tmp_path / "snap.pt"),
           "--out", str(tmp_path / "two-final.pt")]
    nodes = [start([*common, "--node-rank", str(i), "--run-dir", str(tmp_path / f"node{i}"), *job], cwd=tmp_path)
             for i in range(2)]
    results = [finish(p) for p in nodes]
    for code, out in results:
        assert code == 0, out[-3000:]
    ranks = {e["rank"] for i in range(2) for e in events(tmp_path / f"node{i}") if e["kind"] == "start"}
    assert ranks == {0, 1}
    assert_same_weights(tmp_path / "two-final.pt", reference)


def test_sigterm_is_forwarded_and_the_job_stops(tmp_path: Path) -> None:
    proc = start(snapshot_job(tmp_path, "term", steps=100000), cwd=tmp_path)
    run_dir = tmp_path / "term"
    wait_for(lambda: last_step(run_dir, 1) >= 5, 120, "rank 1 to reach step 5", proc)
    pids = [worker_pid(run_dir, rank=r) for r in (0, 1)]
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, timeout=60)
    assert code == 143 and "stopped by SIGTERM" in out  # 128 + SIGTERM, what Kubernetes and Slurm expect
    assert "Traceback" not in out, out[-4000:]
    assert sum(e["kind"] == "fault" and e.get("cause") == "sigterm" for e in events(run_dir)) == 2
    # The script never calls resctl.checkpoint, so there is no step boundary to wait for: both
    # workers leave on their own at once instead of training on until the launcher's SIGKILL.
    assert sorted(e["rank"] for e in events(run_dir) if e["kind"] == "end" and e.get("status") == "sigterm") == [0, 1]
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_metrics_are_served_while_the_job_runs(tmp_path: Path) -> None:
    import re
    import urllib.request

    # Port 0: the endpoint binds a free port and resctl prints the one it got.
    proc = start(snapshot_job(tmp_path, "metrics", steps=100000,
                              extra=("--metrics-port", "0", "--metrics-addr", "127.0.0.1")), cwd=tmp_path)
    run_dir = tmp_path / "metrics"
    try:
        assert proc.stdout is not None
        line = next(line for line in proc.stdout if "metrics on" in line)
        match = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", line)
        assert match and int(match.group(1)) != 0, line
        port = int(match.group(1))
        wait_for(lambda: last_step(run_dir, 0) >= 10, 120, "rank 0 to reach step 10", proc)

        def scrape() -> tuple[float, str]:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            return next(float(line.split()[-1]) for line in body.splitlines()
                        if line.startswith("resctl_steps_total")), body

        # A scrape shows the last update of the metrics thread (every second), not the file of this instant.
        steps, body = wait_for(lambda: (got := scrape())[0] >= 10 and got, 10, "the metrics to show step 10", proc)
        assert steps <= last_step(run_dir, 0)
        assert "resctl_launcher_cycle 0.0" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc, timeout=60)


def test_two_jobs_on_one_host_do_not_collide(tmp_path: Path) -> None:
    """Standalone rendezvous binds port 0 and every run gets its own id and MASTER_PORT."""
    jobs = [start(snapshot_job(tmp_path, f"job{i}", steps=20), cwd=tmp_path) for i in range(2)]
    results = [finish(p) for p in jobs]
    for code, out in results:
        assert code == 0, out[-3000:]
    import re

    run_ids = {m.group(1) for _, out in results for m in re.finditer(r"^resctl: run (\S+) -> ", out, re.M)}
    assert len(run_ids) == 2
