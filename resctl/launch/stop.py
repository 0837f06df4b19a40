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

import os
import signal
import stat
import tempfile
import time
from pathlib import Path
from typing import Iterable, Mapping, MutableMapping

from resctl.profile import contract
from resctl.profile.contract import FATAL_FILE, read_fatal, record_fatal

ENV = contract.STOP_FILE
#: Set by the launcher for workers it starts after a job stop arrived while it was restarting (the
#: signal had no worker to reach): such a worker begins the job stop as soon as its shim is in place.
JOB_STOP_ENV = contract.JOB_STOP
__all__ = ["ENV", "FATAL_FILE", "JOB_STOP_ENV", "read_fatal", "record_fatal", "stop_job"]  # fatal.json: the contract's


#: The private directory's name begins so, then the launcher's PID and "-" (resctl.launch.leftovers).
DIR_PREFIX = "resctl-stop-"
MARKER = "marker"


def file_for(launcher_pid: int) -> Path:
    """Make the marker's place for one launcher: a new directory only this user can enter
    (`mkdtemp`: a random name, created exclusively, 0700) in node-local shared memory when there
    is some. Nobody else can plant the marker there (a planted one would turn a real SIGTERM into a
    restart stop: no final save) or a link where its temporary file is written."""
    return Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{launcher_pid}-", dir=dir_base())) / MARKER


def dir_base() -> str:
    """Where the private directories go: node-local shared memory, else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def mark_restart(path: Path, pids: Iterable[int]) -> None:
    """Record the PIDs about to be stopped for a restart (atomically: a reader sees all or none)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(" ".join(str(p) for p in sorted(set(pids))))
        os.replace(tmp, path)
    except OSError:
        pass  # best effort: without it a worker treats the SIGTERM as a job stop; the stop timeout still bounds it


def clear(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def remove(path: Path) -> None:
    """The launcher is done: its marker and the private directory around it go."""
    clear(path)
    clear_left(path)
    clear(path.with_name(LATE_IMPORTS))
    clear(path.with_name(STEPPED))
    clear(path.with_name(path.name + ".tmp"))
    try:
        path.parent.rmdir()
    except OSError:
        pass


def _launcher_alive(env: Mapping[str, str]) -> bool:
    """This process's launcher (`contract.LAUNCHER_PID` in `env`) is still its parent (True without one)."""
    try:
        return os.getppid() == int(env[contract.LAUNCHER_PID])
    except (KeyError, ValueError):
        return True


def _trusted(path: Path) -> bytes | None:
    """The marker's bytes when this user made it in a directory only this user can write, else None
    (followed through no link: a marker or directory of another user, or a link, is not believed)."""
    me = os.geteuid()
    try:
        parent = os.lstat(path.parent)
        if not stat.S_ISDIR(parent.st_mode) or parent.st_uid != me or parent.st_mode & 0o022:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != me or info.st_size > 1 << 20:
            return None
        return os.read(fd, info.st_size + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def is_restart_stop(env: Mapping[str, str], pid: int) -> bool:
    """True when the launcher named this process in its restart-stop marker."""
    path = env.get(ENV)
    if not path:
        return False
    data = _trusted(Path(path))
    if data is None:
        return False
    try:
        return str(pid) in data.decode("ascii").split()
    except UnicodeDecodeError:
        return False


#: How a worker left on a job stop, in `mark_left`'s file: its own SIGTERM, or woken by another rank's stop.
OWN, PEER = "own", "peer"


def mark_left(env: Mapping[str, str], pid: int, how: str) -> None:
    """A worker beginning a job stop records how (OWN or PEER) beside its launcher's restart-stop marker,
    for the launcher to read after the workers have left (`left`); best effort, like the marker."""
    _mark(env, f"left-{pid}", how)


def _mark(env: Mapping[str, str], name: str, content: str) -> None:
    """Write `name` beside the launcher's marker; nothing when the launcher is gone (this worker's parent is no
    longer the PID its launcher gave it): nobody reads it then, and `resctl run` is removing the directory
    (a file written after its clean-up kept the directory on the node: resctl.launch.leftovers)."""
    path = env.get(ENV)
    if not path or not _launcher_alive(env):
        return
    try:
        fd = os.open(Path(path).with_name(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(content)
    except OSError:
        pass


#: A forked worker's note beside the marker: its script imported what the launcher imports late for restarted
#: workers (`resctl.launch.preload.LATE_PRELOAD`), so the launcher imports it too (`LatePreload`).
LATE_IMPORTS = "late-imports"


def mark_late_imports(env: Mapping[str, str]) -> None:
    """A forked worker's script imported the launcher's late preload (`LATE_IMPORTS`); best effort."""
    _mark(env, LATE_IMPORTS, "1")


def late_imports_marked(path: Path) -> bool:
    """A worker of this launcher (whose marker is `path`) said its script imported the late preload."""
    return _trusted(path.with_name(LATE_IMPORTS)) is not None


#: An exec'd worker's note beside the marker at its first step: its script imports torch, so a restarted worker may
#: start in a standby interpreter that imported it already (`resctl.launch.standby`).
STEPPED = "stepped"


def mark_stepped(env: Mapping[str, str]) -> None:
    """An exec'd worker made its first step (`STEPPED`); best effort."""
    _mark(env, STEPPED, "1")


def stepped_marked(path: Path) -> bool:
    """A worker of this launcher (whose marker is `path`) noted its first step."""
    return _trusted(path.with_name(STEPPED)) is not None


#: What a worker saving the job stop's final checkpoint writes in its `saving-<pid>` file (`mark_saving`).
SAVING = "saving"


def mark_saving(env: Mapping[str, str], pid: int) -> None:
    """A worker beginning the job stop's final save says so (`saving_after_a_stop`); best effort."""
    _mark(env, f"saving-{pid}", SAVING)


def _marks(path: Path, prefix: str, allowed: tuple[str, ...]) -> dict[int, str]:
    """PID -> content of this launcher's workers' `<prefix><pid>` files since `clear_left` (files this
    user made, in the private directory of `file_for`, holding one of `allowed`)."""
    found: dict[int, str] = {}
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix)]
    except OSError:
        return found
    for name in names:
        pid, data = name.removeprefix(prefix), _trusted(path.parent / name)
        if pid.isdigit() and data is not None and data.decode("ascii", "replace") in allowed:
            found[int(pid)] = data.decode()
    return found


def left(path: Path) -> set[str]:
    """How this launcher's workers left on a job stop (OWN, PEER)."""
    return set(_marks(path, "left-", (OWN, PEER)).values())


def saving_after_a_stop(exits: Mapping[int, int | None], path: Path) -> bool:
    """Workers (PID -> exit code, None: running) that left on a job stop while others still save its final
    checkpoint: some exited non-zero, each of those after leaving on the stop, and some still running said
    they are saving (`mark_saving`; `path`: the launcher's marker). Reads the directory only when some
    exited non-zero and some still run."""
    failed = {pid for pid, code in exits.items() if code not in (0, None)}
    running = {pid for pid, code in exits.items() if code is None}
    return bool(failed and running) and failed <= set(_marks(path, "left-", (OWN, PEER))) and \
        bool(running & set(_marks(path, "saving-", (SAVING,))))


def clear_left(path: Path) -> None:
    """The `left-` and `saving-` files go (a new cycle of workers)."""
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(("left-", "saving-"))]
    except OSError:
        return
    for name in names:
        clear(path.parent / name)


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


class RestartClock:
    """When this launcher saw a cycle fail and when it had stopped that cycle's workers (unix times), handed to
    the next cycle's workers (`contract.RESTART_CLOCK`: their `start` event's `detected` and `stopped`, by which
    `resctl report` times a restart's detection and stop; without them one killed rank's whole kill -> new
    process gap read as rendezvous)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def failed(self) -> None:
        """The monitor saw the cycle fail (its first look that did)."""
        self.times = self.times or [time.time()]

    def stopping(self) -> None:
        """The cycle's workers are being stopped: a peer's restart is seen here, no failure of this node's."""
        self.failed()

    def stopped(self) -> None:
        self.times = [*self.times[:1], time.time()]

    def hand_to(self, envs: Iterable[MutableMapping[str, str]]) -> None:
        """Into each new worker's environment, once (a first start has none)."""
        if len(self.times) == 2:
            for env in envs:
                env[contract.RESTART_CLOCK] = contract.restart_clock_value(*self.times)
        self.times = []
