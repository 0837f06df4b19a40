"""Where the memory tier keeps a job's snapshots, and who removes them (no torch import here:
`resctl run` and `doctor` use it).

Layout, one tree per job and node, in host shared memory (tmpfs, so it outlives a killed worker
but not the node)::

    /dev/shm/resctl-<job>/          <job>: the run id (TORCHELASTIC_RUN_ID), else a hash of checkpoint.dir
      rank-<R>/slot-0/ slot-1/      the slots (resctl.checkpoint.slots): checkpoint directories in the disk format (data-0.bin,
                                    meta.pt, manifest.json written last), see resctl.checkpoint.memory
      replica/rank-<R>/slot-0|1/    the buddy copies of another node's ranks, kept by this node's
                                    replica server (resctl.checkpoint.replica), same format

Lifecycle: every worker that finishes its script cleanly removes its own `rank-<R>` (and the job
directory once empty); `resctl run` removes the whole job directory of its node when the launcher
exits, whatever the exit code (a backstop for killed workers and failed jobs). A new run has a new
run id, so it never restores another run's memory: it resumes from disk.
`RESCTL_SHM_DIR` moves the root (tests; nodes whose tmpfs is elsewhere).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from resctl.checkpoint import slots

SHM_ENV = "RESCTL_SHM_DIR"
DEFAULT_ROOT = "/dev/shm"
PREFIX = "resctl-"
SLOTS = slots.SLOTS  # how many, and which is next: resctl.checkpoint.slots


def shm_root() -> Path:
    return Path(os.environ.get(SHM_ENV) or DEFAULT_ROOT)


def job_key(run_id: str, ckpt_dir: str | os.PathLike[str]) -> str:
    """A file-name-safe key of the job: its run id, else (no launcher) a hash of the checkpoint dir."""
    if run_id:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:80]
        return safe if safe.strip(".") else "run"
    digest = hashlib.sha1(str(Path(ckpt_dir).resolve()).encode()).hexdigest()[:12]
    return f"dir-{digest}"


def job_dir(key: str, root: Path | None = None) -> Path:
    return (root or shm_root()) / f"{PREFIX}{key}"


def rank_dir(key: str, rank: int, root: Path | None = None) -> Path:
    return job_dir(key, root) / f"rank-{rank}"


def replica_dir(key: str, rank: int, root: Path | None = None) -> Path:
    """Where this node's replica server keeps the buddy copies of `rank`'s snapshots."""
    return job_dir(key, root) / "replica" / f"rank-{rank}"


def release_job(run_id: str, root: Path | None = None) -> bool:
    """Remove a job's memory snapshots on this node (the `resctl run` backstop); True if any were there."""
    if not run_id:
        return False
    path = job_dir(job_key(run_id, ""), root)
    if not path.exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def release_rank(key: str, rank: int, root: Path | None = None) -> None:
    """Remove one rank's snapshots, then the job directory if no rank has any left."""
    shutil.rmtree(rank_dir(key, rank, root), ignore_errors=True)
    try:
        job_dir(key, root).rmdir()
    except OSError:
        pass  # other ranks still hold theirs (or it is gone already)


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` (created 0600, truncated), all of it: a small file of a slot
    (`meta.pt`, a manifest's temp) in shared memory, where no fsync is needed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
    finally:
        os.close(fd)
