"""Why a worker got SIGTERM: the launcher stopping it for a restart, or a stop of the whole job.

Both arrive as SIGTERM, and they want opposite things. A restart stop must be quick: a dead peer
means no collective will ever complete, so a final checkpoint cannot be made and every second spent
is a second of the restart. A stop of the job (a pod deleted, a Slurm preemption; `resctl run` or
the launcher receives it first) wants the final checkpoint at the next step boundary.

The launcher (resctl's adapters, `resctl.launch.adapters`) writes the PIDs it is about to stop for a restart
into a small per-launcher file *before* it sends the signal; the shim reads it when SIGTERM arrives.
A worker that finds its PID there leaves at once; any other SIGTERM is a stop of the job. A missing
or unreadable file therefore errs on the side of saving, and the launcher's short stop timeout
(`launch.workers_stop_timeout`) bounds a restart either way.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

ENV = "RESCTL_STOP_FILE"
FATAL_FILE = "fatal.json"  # in the run directory: a worker's reason to stop the job instead of restarting it


def file_for(launcher_pid: int) -> Path:
    """The marker of one launcher: node-local (shared memory when there is some)."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    return Path(base) / f"resctl-stop-{launcher_pid}"


def mark_restart(path: Path, pids: Iterable[int]) -> None:
    """Record the PIDs about to be stopped for a restart (atomically: a reader sees all or none)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(" ".join(str(p) for p in sorted(set(pids))), encoding="ascii")
        os.replace(tmp, path)
    except OSError:
        pass  # best effort: without it a worker treats the SIGTERM as a job stop; the stop timeout still bounds it


def clear(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def is_restart_stop(env: Mapping[str, str], pid: int) -> bool:
    """True when the launcher named this process in its restart-stop marker."""
    path = env.get(ENV)
    if not path:
        return False
    try:
        text = Path(path).read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError):
        return False
    return str(pid) in text.split()


def stop_job(run_dir: Path | None, rank: int, err: BaseException, exit_code: int) -> None:
    """A fault that no restart can cure (a checkpoint directory another job owns, a checkpoint that
    does not fit the state, saves that keep failing): record why, once per run, and stop the job by
    sending SIGTERM to this worker's launcher, which then stops every worker as for a job stop.
    `resctl run` prints the reason and exits with `exit_code` instead of restarting up to max_restarts."""
    if run_dir is not None:
        record_fatal(run_dir, {"rank": rank, "error": f"{type(err).__name__}: {err}", "exit_code": exit_code})
    try:
        os.kill(os.getppid(), signal.SIGTERM)
    except OSError:
        pass


def record_fatal(run_dir: Path, record: dict[str, Any]) -> None:
    """Write fatal.json once per run: complete before it is visible, first writer wins (a rank stopped
    mid-write by another rank's SIGTERM to the launcher must not leave an empty reason behind).
    `record` holds `exit_code` and `error`, and `rank` (a worker's) or `cause` (`resctl run`'s own,
    e.g. no_progress from the health watch)."""
    tmp = run_dir / f".{FATAL_FILE}.{os.getpid()}.{threading.get_ident()}"
    try:
        tmp.write_text(json.dumps(record), encoding="utf-8")
        os.link(tmp, run_dir / FATAL_FILE)
    except OSError:
        pass  # another rank said it first (or the run dir is gone): one reason is enough
    finally:
        tmp.unlink(missing_ok=True)


def read_fatal(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((run_dir / FATAL_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("exit_code"), int) else None
