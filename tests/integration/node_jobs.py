"""`resctl run` jobs of examples/train_ckpt.py on network-namespace nodes (netns_cluster.py), one worker per
node unless told, held before the first step until the test releases it (`--hold-until`), for the tests of hot spares and of a node's own stop (test_hot_spare.py, test_node_stop.py). Every wait
polls a file (the run's events, a node's console) instead of sleeping."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, events, torchrun, wait_for
from tests.integration.netns_cluster import Cluster

SCRIPT = str(EXAMPLES / "train_ckpt.py")
STEPS = 60
STEP_TIME = "0.05"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
for _k in ("SLURM_JOB_ID", "JOB_COMPLETION_INDEX", "RESCTL_VERBOSE"):
    ENV.pop(_k, None)


class Nodes:
    """The `resctl run` of each node of one job; node i's console goes to <tmp>/n<i>.log (a restarted
    node appends to it)."""

    def __init__(self, c: Cluster, tmp: Path, nnodes: str, port: int, steps: int = STEPS,
                 env: dict[str, str] | None = None, nproc: int = 1, options: tuple[str, ...] = (),
                 script_args: tuple[str, ...] = ()) -> None:
        self.c, self.tmp, self.nnodes, self.port, self.steps = c, tmp, nnodes, port, steps
        self.env = {**ENV, **(env or {})}
        self.nproc, self.options, self.script_args = nproc, options, script_args  # more `resctl run` options, script's
        self.run_dir = tmp / "run"
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.go = tmp / "go"  # the script's first step waits for it (`release`)

    def release(self) -> None:
        """Let the workers (held before their first step) train."""
        self.go.touch()

    def started(self) -> set[int]:
        """The ranks whose worker has started (the first rendezvous is complete once all have)."""
        return {e["rank"] for e in self.events() if e["kind"] == "start"}

    def start(self, i: int) -> None:
        args = ["run", "-p", str(LOCAL_PROFILE), "--nproc-per-node", str(self.nproc),
                "--set", f"launch.rdzv_endpoint={self.c.addrs[0]}:{self.port}", "--set", f"launch.nnodes={self.nnodes}",
                "--set", f"launch.local_addr={self.c.addrs[i]}", "--set", f"launch.rdzv_id=t{self.c.tag}",
                "--rdzv-conf", f"is_host={int(i == 0)},join_timeout=60,last_call_timeout=2",
                "--set", "heartbeat.timeout=6s", "--set", "launch.max_restarts=3",
                "--run-dir", str(self.run_dir), "--set", f"checkpoint.dir={self.tmp / 'ckpt'}",
                "--set", "checkpoint.interval_steps=5", *self.options,
                SCRIPT, "--steps", str(self.steps), "--step-time", STEP_TIME, "--out", str(self.tmp / "final.pt"),
                "--hold-until", str(self.go), *self.script_args]
        with open(self.log(i), "ab") as out:
            self.procs[i] = subprocess.Popen([*self.c.exec_prefix(i), sys.executable, "-m", "resctl", *args],
                                             cwd=self.tmp, env={**self.env, "GLOO_SOCKET_IFNAME": self.c.dev(i)},
                                             stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def log(self, i: int) -> Path:
        return self.tmp / f"n{i}.log"

    def said(self, i: int) -> str:
        return self.log(i).read_text(errors="replace") if self.log(i).exists() else ""

    def top(self) -> int:
        return max((e["step"] for e in self.events() if e["kind"] == "step"), default=0)

    def events(self) -> list[dict[str, Any]]:
        return events(self.run_dir) if self.run_dir.exists() else []

    def wait(self, predicate: Any, timeout: float, what: str) -> Any:
        try:
            return wait_for(predicate, timeout, what)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{self.consoles()}") from None

    def wait_said(self, i: int, text: str, timeout: float) -> None:
        self.wait(lambda: text in self.said(i), timeout, f"node {i} to say {text!r}")

    def finish(self, nodes: list[int], timeout: float) -> dict[int, int | None]:
        """Exit codes (None: still running at the deadline, then killed)."""
        deadline = time.monotonic() + timeout
        codes: dict[int, int | None] = {}
        for i in nodes:
            try:
                codes[i] = self.procs[i].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.c.kill(i)
                self.procs[i].wait()
                codes[i] = None
        return codes

    def consoles(self) -> str:
        return "\n".join(f"--- node {i} ---\n{self.said(i)[-2500:]}" for i in sorted(self.procs))


@pytest.fixture(scope="session")
def ckpt_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Final state of a fault-free 2-rank run of train_ckpt.py under plain torchrun (same steps)."""
    tmp = tmp_path_factory.mktemp("spare-ref")
    env = {**ENV, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = torchrun(["--nproc-per-node", "2", "--standalone", SCRIPT, "--steps", str(STEPS), "--out", str(tmp / "ref.pt")],
                    cwd=tmp, env=env, timeout=240)  # run again once on torch's gloo exit race (seen in CI's pass 1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return tmp / "ref.pt"
