"""A second, unprivileged local user for tests that perform an attack (issue 27).

The tests run as root (CI, the dev VM); `attacker` creates the user `resctl-attacker` once (kept:
another test run may be using it) and skips where that is impossible. `as_user` runs a function in
a forked child that has dropped to that user, so the attacker's step really is another user's.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import traceback
from dataclasses import dataclass
from typing import Callable

import pytest

NAME = "resctl-attacker"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="session")
def attacker() -> User:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user")
    try:
        entry = pwd.getpwnam(NAME)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
                              capture_output=True, text=True)
        try:
            entry = pwd.getpwnam(NAME)
        except KeyError:
            pytest.skip(f"cannot create a second user: {made.stderr.strip()}")
    return User(NAME, entry.pw_uid, entry.pw_gid)


def as_user(user: User, step: Callable[[], None]) -> None:
    """Run `step` as `user` in a forked child; an exception there fails the calling test."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges for good, then attack
        os.close(read_fd)
        code = 0
        try:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            step()
        except BaseException:  # noqa: BLE001 - reported to the parent
            os.write(write_fd, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as fh:
        report = fh.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the attacker's step failed:\n{report}"
