"""What a launcher killed before its own clean-up (SIGKILL, the OOM killer) leaves on the node, and its removal.

A launcher that exits on its own removes its private stop directory (`resctl.launch.stop.file_for`, an atexit
in `resctl.launch.ft_entry`) and NVRx removes its IPC sockets. A SIGKILL runs neither: each killed launcher
left an empty directory in /dev/shm and two or more socket files in the temporary directory, for good (a node
that restarts a crashing job every few minutes gathers thousands). `resctl run` outlives its launcher and
knows its PID: once it has reaped it, it removes what is keyed by that PID (`remove_for`).

Only this user's entries of the exact names are touched: a stop directory `resctl-stop-<pid>-*`, emptied of
the files resctl writes there and removed only if nothing else is in it; NVRx's `_ft_launcher<pid>.socket`
and `_ft_launcher<pid>_rmon<local rank>.socket` (0.4.1 and 0.7.0 name them so), and only sockets.
Not removed: NVRx's `_ft_launcher<rank monitor pid>_to_rmon.socket`, keyed by a PID `resctl run` never
learns; leftovers of a launcher whose `resctl run` was killed too (nothing outlives both). Removing another
dead launcher's by PID liveness is not safe where containers share /tmp or /dev/shm but not PIDs.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable

from resctl.launch import stop


def nvrx_sockets(launcher_pid: int) -> re.Pattern[str]:
    """The names of the IPC sockets NVRx's launcher of this PID binds (in the temporary directory)."""
    return re.compile(rf"_ft_launcher{launcher_pid}(_rmon\d+)?\.socket")


def remove_for(launcher_pid: int) -> list[str]:
    """Remove the stop directory and NVRx sockets of a launcher that is gone; returns what was removed."""
    removed: list[str] = []
    stop_dirs = re.compile(rf"{re.escape(stop.DIR_PREFIX)}{launcher_pid}-[^/]+")
    for entry in _own(stop.dir_base(), stop_dirs, stat.S_ISDIR):  # where `stop.file_for` made it
        stop.remove(Path(entry) / stop.MARKER)
        if not os.path.lexists(entry):
            removed.append(entry)
    for entry in _own(tempfile.gettempdir(), nvrx_sockets(launcher_pid), stat.S_ISSOCK):
        try:
            os.unlink(entry)
            removed.append(entry)
        except OSError:
            pass
    return removed


def _own(base: str, name: re.Pattern[str], kind: Callable[[int], bool]) -> list[str]:
    """Paths in `base` whose name is `name`, of this kind (an lstat: a link is never one), made by this user."""
    found: list[str] = []
    try:
        entries = [e for e in os.scandir(base) if name.fullmatch(e.name)]
    except OSError:
        return found
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if kind(st.st_mode) and st.st_uid == os.geteuid():
            found.append(entry.path)
    return found
