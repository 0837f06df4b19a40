"""One live owner per checkpoint directory: an flock on `<dir>/.resctl-owner`.

The writing rank of a job (global rank 0) holds an exclusive `flock` on the file for as long as
its process lives and records who it is in it (run id, pid, host, since). The kernel drops the
lock when that process dies, SIGKILL included, so a stale file never blocks anyone. A second job
that points at the same directory is refused: `resctl run` checks before it launches
(`check_free`, exit 2), and the worker checks again when it takes the lock (`Ownership.acquire`).

Filesystems without flock support (some NFS or Lustre mounts: ENOLCK / EOPNOTSUPP) get a warning
and no lock: the check cannot be made there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from resctl.checkpoint.errors import CheckpointDirInUse

LOCK_NAME = ".resctl-owner"
UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)
log = logging.getLogger("resctl.checkpoint")


def _holder(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def in_use_error(root: Path, holder: dict[str, Any]) -> CheckpointDirInUse:
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, (int, float)) else "?"
    return CheckpointDirInUse(
        f"checkpoint dir {root} is in use by run {holder.get('run_id') or '?'} (pid {holder.get('pid', '?')} on "
        f"{holder.get('host', '?')}, since {when}). Two jobs in one directory overwrite and resume each other's "
        "steps. Fix: give this job its own directory (--set checkpoint.dir=PATH), or stop that run first."
    )


def check_free(root: str | os.PathLike[str], run_id: str | None = None) -> None:
    """Raise CheckpointDirInUse if a live process of another run than `run_id` owns `root` (nothing is created
    or kept). The same run's owner is no conflict: a node that joins a running job late (a hot spare, a
    replaced pod) shares the directory with the rank 0 that holds it."""
    path = Path(root) / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # no directory or no lock file: nobody owns it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(path)
        if run_id is None or holder.get("run_id") != run_id:
            raise in_use_error(Path(root), holder) from None
    except OSError:
        return
    finally:
        os.close(fd)


# Locks held by this process, by directory: several Checkpointers of one process (a reconfigure,
# an in-process restart) share one; flock would refuse a second open file of the same process.
_held: dict[str, tuple[int, int]] = {}
_held_lock = threading.Lock()


class Ownership:
    """The exclusive lock of one checkpoint directory, held until `release()` or process exit."""

    def __init__(self, root: Path, run_id: str) -> None:
        self.root = root
        self.run_id = run_id
        self._key: str | None = None

    @property
    def held(self) -> bool:
        return self._key is not None

    def acquire(self, patience: float = 5.0) -> None:
        """Take the lock, waiting up to `patience` seconds (a `resctl run` check or the previous
        worker of this run may hold it for a moment); raise CheckpointDirInUse after that."""
        if self._key is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(self.root)
        with _held_lock:
            if key in _held:
                fd, count = _held[key]
                _held[key] = (fd, count + 1)
                self._key = key
                return
            locked = _lock(self.root, patience)
            if locked is None:
                return
            fd = locked
            info = {"run_id": self.run_id, "pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            _held[key] = (fd, 1)
            self._key = key

    def release(self) -> None:
        key, self._key = self._key, None
        if key is None:
            return
        with _held_lock:
            fd, count = _held.pop(key)
            if count > 1:
                _held[key] = (fd, count - 1)
            else:
                os.close(fd)


def _lock(root: Path, patience: float) -> int | None:
    path = root / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + patience
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise in_use_error(root, _holder(path)) from None
            time.sleep(0.1)
        except OSError as err:
            os.close(fd)
            if err.errno in UNSUPPORTED:
                log.warning("checkpoint dir %s: no flock support (%s); a second job there cannot be detected", root, err)
                return None
            raise
