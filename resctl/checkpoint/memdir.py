"""Where the memory tier keeps a job's snapshots, and who removes them (no torch import here:
`resctl run` and `doctor` use it).

Layout, one tree per job and node, in host shared memory (tmpfs, so it outlives a killed worker
but not the node)::

    /dev/shm/resctl-<job>-<launch>/ <job>: the run id (TORCHELASTIC_RUN_ID), else a hash of checkpoint.dir;
                                    <launch>: `p<pid>-<random>` of the `resctl run` that started the
                                    job on this node (RESCTL_SHM_LAUNCH, handed to its workers, which
                                    a restarted worker inherits); without resctl run, no suffix
      rank-<R>/slot-0/ slot-1/      the slots (resctl.slots): checkpoint directories in the disk format (data-0.bin,
                                    meta.pt, manifest.json written last), see resctl.checkpoint.memory
      replica/rank-<R>/slot-0|1/    the buddy copies of another node's ranks, kept by this node's
                                    replica server (resctl.checkpoint.replica), same format

Lifecycle: every worker that finishes its script cleanly removes its own `rank-<R>` (and the job
directory once empty); `resctl run` removes the whole job directory of its node when the launcher
exits, whatever the exit code (a backstop for killed workers and failed jobs). A new run has a new
run id, so it never restores another run's memory: it resumes from disk. Two jobs with one run id
on one node (two `srun` steps of one allocation share SLURM_JOB_ID) have different launch suffixes,
so they never see each other's snapshots; `resctl run` also removes the trees of its job's earlier
launches on the node whose `resctl run` is gone (killed: nobody released them).
`RESCTL_SHM_DIR` moves the root (tests; nodes whose tmpfs is elsewhere).

Safety against other local users (docs/security.md): `/dev/shm` is writable by everyone and run ids
are predictable. Every directory of the tree is made by `ensure_private`: created 0700, or, when it
exists, used only if it is a real directory (not a link) that this user owns and nobody else may
write; anything else is refused (`MemoryDirUnsafe`: the tier is off in that process) and never
followed. Below a private job directory nobody else can create or replace an entry, so the files
inside (created 0600, not following links) cannot be redirected.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
from pathlib import Path

from resctl import slots
from resctl.checkpoint.errors import CheckpointError
from resctl.profile import contract

SHM_ENV = contract.SHM_DIR
LAUNCH_ENV = contract.SHM_LAUNCH  # set by `resctl run` for its workers: this launch's suffix
DEFAULT_ROOT = "/dev/shm"
PREFIX = "resctl-"
SLOTS = slots.SLOTS  # how many, and which is next: resctl.slots


class MemoryDirUnsafe(CheckpointError):
    """A memory-tier directory exists but is not this user's own private directory (another user
    made it, or it is a link): it is never used or followed."""


def new_launch() -> str:
    """A launch suffix: this process's PID (so a later launch can tell a dead one's leftovers) and
    a random part nobody can guess."""
    return f"p{os.getpid()}-{secrets.token_hex(8)}"


def _launch(launch: str | None) -> str:
    return os.environ.get(LAUNCH_ENV, "") if launch is None else launch


def shm_root() -> Path:
    return Path(os.environ.get(SHM_ENV) or DEFAULT_ROOT)


def job_key(run_id: str, ckpt_dir: str | os.PathLike[str]) -> str:
    """A file-name-safe key of the job: its run id, else (no launcher) a hash of the checkpoint dir."""
    if run_id:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:80]
        return safe if safe.strip(".") else "run"
    digest = hashlib.sha1(str(Path(ckpt_dir).resolve()).encode()).hexdigest()[:12]
    return f"dir-{digest}"


def job_dir(key: str, root: Path | None = None, launch: str | None = None) -> Path:
    """The job's tree on this node; `launch` defaults to this process's `RESCTL_SHM_LAUNCH`."""
    suffix = _launch(launch)
    return (root or shm_root()) / (f"{PREFIX}{key}-{suffix}" if suffix else f"{PREFIX}{key}")


def rank_dir(key: str, rank: int, root: Path | None = None, launch: str | None = None) -> Path:
    return job_dir(key, root, launch) / f"rank-{rank}"


def replica_dir(key: str, rank: int, root: Path | None = None, launch: str | None = None) -> Path:
    """Where this node's replica server keeps the buddy copies of `rank`'s snapshots."""
    return job_dir(key, root, launch) / "replica" / f"rank-{rank}"


def _owned(path: Path) -> os.stat_result | None:
    """`lstat(path)` when it is a directory (not a link) of this user that nobody else may write."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        raise MemoryDirUnsafe(f"{path} is not a directory (a link or a file is in the way): not used; "
                              "remove it, or give the job another run id")
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise MemoryDirUnsafe(
            f"{path} belongs to uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}, not to this user "
            f"(uid {os.geteuid()}) with mode 700: another user may have made it; not used. Remove it, or give "
            "the job another run id")
    return info


def ensure_private(path: Path) -> None:
    """Create `path` and every missing directory up to its job directory (`resctl-...`), each 0700
    and exclusively; an existing one is used only if it is this user's own private directory
    (`MemoryDirUnsafe` otherwise). Links are never followed. A path outside any job directory (a
    caller's own destination) has only itself secured so."""
    levels = [path]
    while not levels[-1].name.startswith(PREFIX):
        parent = levels[-1].parent
        if parent == levels[-1]:
            path.parent.mkdir(parents=True, exist_ok=True)
            levels = [path]
            break
        levels.append(parent)
    levels[-1].parent.mkdir(parents=True, exist_ok=True)  # the root (/dev/shm, RESCTL_SHM_DIR): not ours to secure
    for level in reversed(levels):
        try:
            os.mkdir(level, 0o700)
        except FileExistsError:
            pass
        if _owned(level) is None:
            raise MemoryDirUnsafe(f"{level} vanished while it was being made")


def _remove_own(path: Path) -> bool:
    """rmtree `path` if it is this user's private directory (another user's is left alone)."""
    try:
        if _owned(path) is None:
            return False
    except MemoryDirUnsafe:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def release_job(run_id: str, root: Path | None = None, launch: str | None = None) -> bool:
    """Remove a job's memory snapshots on this node (the `resctl run` backstop); True if any were there."""
    if not run_id:
        return False
    return _remove_own(job_dir(job_key(run_id, ""), root, launch))


def sweep_dead_launches(run_id: str, root: Path | None = None) -> int:
    """Remove this user's trees of `run_id` left by a `resctl run` that is gone (SIGKILLed before its
    backstop ran); a live one's (another job with the same run id) is kept. Returns how many."""
    if not run_id:
        return 0
    base = root or shm_root()
    pattern = re.compile(re.escape(f"{PREFIX}{job_key(run_id, '')}-p") + r"(\d+)-[0-9a-f]+")
    removed = 0
    try:
        entries = list(os.scandir(base))
    except OSError:
        return 0
    for entry in entries:
        m = pattern.fullmatch(entry.name)
        if m is None or _alive(int(m.group(1))):
            continue
        removed += _remove_own(Path(entry.path))
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def release_rank(key: str, rank: int, root: Path | None = None) -> None:
    """Remove one rank's snapshots, then the job directory if no rank has any left."""
    _remove_own(rank_dir(key, rank, root))
    try:
        job_dir(key, root).rmdir()
    except OSError:
        pass  # other ranks still hold theirs (or it is gone already)


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` (created 0600, truncated), all of it: a small file of a slot
    (`meta.pt`, a manifest's temp) in shared memory, where no fsync is needed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done:])
    finally:
        os.close(fd)
