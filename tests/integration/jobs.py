"""Helpers for tests that start real `resctl run` jobs (real ft_launcher, gloo on CPU)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from resctl.telemetry.events import read_events

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
LOCAL_PROFILE = EXAMPLES / "profiles" / "local-cpu.toml"


def events(run_dir: Path) -> list[dict[str, Any]]:
    return sorted(read_events(run_dir), key=lambda e: e["t"])


def start(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "resctl", "run", *args], cwd=cwd, env=full_env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


#: What a worker prints when torch 2.13's gloo thread aborts it at interpreter exit: the thread drops the
#: last collective's tensor (held by the final barrier's work) after Py_Finalize began, cannot take the
#: GIL, and `pthread_exit` inside a C++ destructor calls `std::terminate`. Seen under plain torchrun on
#: the loaded CI box, about 1 run in 15 of examples/train_loader.py (a core dump's stack, CI stop 36).
TORCH_EXIT_RACE = "terminate called without an active exception"


def torchrun(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`python -m torch.distributed.run ARGS`, captured, for a test's reference run: run again once when
    a worker died of torch's exit race (`TORCH_EXIT_RACE`), a torch bug and not what the test compares."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0 and TORCH_EXIT_RACE in proc.stdout + proc.stderr:
        proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    return proc


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"job exited ({proc.returncode}) before {what}:\n{proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def finish(proc: subprocess.Popen[str], timeout: float = 240) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"job did not finish in {timeout}s:\n{out[-4000:]}") from None
    return proc.returncode, out


def worker_pid(run_dir: Path, rank: int, cycle: int = 0) -> int | None:
    for e in events(run_dir):
        if e["kind"] == "start" and e["rank"] == rank and e["cycle"] == cycle:
            return int(e["pid"])
    return None


def last_step(run_dir: Path, rank: int, cycle: int = 0) -> int:
    steps = [e["step"] for e in events(run_dir) if e["kind"] == "step" and e["rank"] == rank and e["cycle"] == cycle]
    return max(steps, default=0)


def node_step(run_dir: Path, cycle: int | None = 0) -> int:
    """The last step of whichever rank this node's run dir holds, in `cycle` (None: any): on a multi-node job
    the rendezvous gives group ranks in arrival order, so node 1 is not always rank 1."""
    steps = [e["step"] for e in events(run_dir) if e["kind"] == "step" and cycle in (None, e["cycle"])]
    return max(steps, default=0)


SNAPSHOT_SCRIPT = str(EXAMPLES / "train_snapshot.py")


def snapshot_job(tmp_path: Path, name: str, steps: int = 40, extra: tuple[str, ...] = ()) -> list[str]:
    """`resctl run` arguments for the unmodified torchrun-style example, 2 workers on this host."""
    return ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp_path / name), *extra,
            SNAPSHOT_SCRIPT, "--steps", str(steps), "--step-time", "0.05",
            "--snapshot", str(tmp_path / f"{name}-snapshot.pt"), "--out", str(tmp_path / f"{name}-final.pt")]


def assert_same_weights(a: Path, b: Path) -> None:
    import torch

    wa, wb = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.equal(wa[key], wb[key]), key


def fill_disk(path: Path) -> None:
    """Write zeros to `path` until its filesystem is full (a small tmpfs in the tests): a real ENOSPC."""
    with open(path, "wb", buffering=0) as fh:
        try:
            _write_until_full(fh)
        except OSError:
            pass


def _write_until_full(fh: Any) -> None:
    """Zeros into `fh` (unbuffered) until the filesystem refuses a byte: raises the OSError (ENOSPC)."""
    while fh.write(b"\0" * (64 << 10)):
        pass


@contextlib.contextmanager
def disk_kept_full(path: Path) -> Iterator[None]:
    """The filesystem of `path` full, and kept full while the block runs: a thread takes back every byte another
    process frees (a checkpoint pruned, a failed write's partial file removed) within milliseconds, as a disk filled
    by someone else's writer stays full. `fill_disk` alone left the space such a delete freed to the next save (CI,
    ci14: the job's saves went on succeeding after the fill)."""
    stop = threading.Event()
    filled = threading.Event()

    def keep() -> None:
        with open(path, "ab", buffering=0) as fh:
            while not stop.is_set():
                try:
                    _write_until_full(fh)
                except OSError:  # ENOSPC: full; look again in a moment
                    filled.set()
                    stop.wait(0.002)

    thread = threading.Thread(target=keep, name="disk-kept-full", daemon=True)
    thread.start()
    filled.wait(60)
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def stop_phase_reached(phase: str, marks: Path, run_dir: Path) -> bool:
    """Has a job of bench/scripts/stop_phases.py reached `phase`? fork/refork: the launcher's last line before
    it forks the first cycle's (the first restart's) workers, resctl's own on every NVRx; the others: a file
    the script writes as it enters the phase."""
    if phase in ("fork", "refork"):
        from resctl.launch.agent import STARTING_WORKERS

        log = run_dir / "launcher.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return text.count(STARTING_WORKERS) >= (2 if phase == "refork" else 1)
    return any(p.name.startswith(f"{phase}-") for p in marks.iterdir())
