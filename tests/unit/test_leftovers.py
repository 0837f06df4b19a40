"""What a SIGKILLed launcher leaves on the node, removed by `resctl run` (resctl.launch.leftovers): its own
stop directory and NVRx sockets only, real directories and real sockets, this user's only."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from resctl.launch import leftovers, stop
from tests.attacker import User, as_user, attacker  # noqa: F401 - the fixture

PID = 4_100_000 + os.getpid() % 100_000  # above any real PID here: nothing of a live process is touched


@pytest.fixture
def node(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """(shm, tmp): the launcher's private-directory base and the temporary directory, both fresh (short
    paths: a Unix socket's name has room for 107 bytes)."""
    root = Path(tempfile.mkdtemp(prefix="lo-", dir="/tmp"))
    shm, tmp = root / "shm", root / "tmp"
    shm.mkdir()
    tmp.mkdir()
    for d in (root, shm, tmp):
        d.chmod(0o777)  # the other user of the ownership test makes its own there
    monkeypatch.setattr(stop, "dir_base", lambda: str(shm))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    yield shm, tmp
    shutil.rmtree(root, ignore_errors=True)


def bind(path: Path, keep: list[socket.socket]) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    keep.append(s)


def test_a_killed_launchers_directory_and_sockets_go_and_nothing_else(node: tuple[Path, Path]) -> None:
    shm, tmp = node
    keep: list[socket.socket] = []
    marker = stop.file_for(PID)  # what the launcher made, with what its workers wrote there
    stop.mark_restart(marker, [11, 12])
    stop.mark_left({stop.ENV: str(marker)}, 11, stop.OWN)
    stop.mark_late_imports({stop.ENV: str(marker)})
    other = stop.file_for(PID * 10 + 1)  # another launcher whose PID begins with this one's
    stray = Path(tempfile.mkdtemp(prefix=f"{stop.DIR_PREFIX}{PID}-", dir=shm))
    (stray / "notes.txt").write_text("not resctl's")  # a file resctl never writes: the directory stays
    link = shm / f"{stop.DIR_PREFIX}{PID}-link"
    link.symlink_to(other.parent)
    for name in (f"_ft_launcher{PID}.socket", f"_ft_launcher{PID}_rmon0.socket", f"_ft_launcher{PID}_rmon1.socket",
                 f"_ft_launcher{PID}_to_rmon.socket", f"_ft_launcher{PID}1.socket"):
        bind(tmp / name, keep)
    (tmp / f"_ft_launcher{PID}_rmon2.socket").write_text("a plain file")
    try:
        removed = leftovers.remove_for(PID)
    finally:
        for s in keep:
            s.close()
    assert sorted(removed) == sorted([str(marker.parent), str(tmp / f"_ft_launcher{PID}.socket"),
                                      str(tmp / f"_ft_launcher{PID}_rmon0.socket"),
                                      str(tmp / f"_ft_launcher{PID}_rmon1.socket")])
    assert not marker.parent.exists()
    assert (stray / "notes.txt").read_text() == "not resctl's"
    assert link.is_symlink() and other.parent.is_dir()
    assert sorted(p.name for p in tmp.iterdir()) == sorted([
        f"_ft_launcher{PID}_to_rmon.socket", f"_ft_launcher{PID}1.socket", f"_ft_launcher{PID}_rmon2.socket"])
    assert leftovers.remove_for(PID) == [], "a second call finds nothing"


def test_a_worker_whose_launcher_is_gone_writes_nothing_there(node: tuple[Path, Path]) -> None:
    """A worker outlives its SIGKILLed launcher by its final save: its marks would land in the directory
    `resctl run` is removing, which then stayed on the node (seen in CI). A real orphan: a grandchild whose
    parent (its "launcher") has exited writes nothing; one whose launcher lives does."""
    from resctl.profile import contract

    marker = stop.file_for(PID)
    env = {stop.ENV: str(marker), contract.LAUNCHER_PID: str(os.getpid())}
    stop.mark_left(env, 11, stop.OWN)  # this process's parent is not the launcher named: nothing
    assert stop.left(marker) == set()
    stop.mark_left({**env, contract.LAUNCHER_PID: str(os.getppid())}, 11, stop.OWN)
    assert stop.left(marker) == {stop.OWN}
    stop.clear_left(marker)
    go_r, go_w = os.pipe()
    done_r, done_w = os.pipe()
    launcher = os.fork()
    if launcher == 0:  # the "launcher": forks its worker and exits at once (as SIGKILLed)
        me = os.getpid()
        if os.fork() == 0:
            said = b"0"  # an error in the orphan must not unwind into pytest's copy of itself
            try:
                os.read(go_r, 1)  # the launcher has been reaped: this worker is an orphan now
                for mark in (lambda e: stop.mark_left(e, 12, stop.OWN), lambda e: stop.mark_saving(e, 12)):
                    mark({**env, contract.LAUNCHER_PID: str(me)})
                said = b"1"
            finally:
                os.write(done_w, said)
                os._exit(0)
        os._exit(0)
    os.waitpid(launcher, 0)
    os.write(go_w, b"1")
    assert os.read(done_r, 1) == b"1"
    for fd in (go_r, go_w, done_r, done_w):
        os.close(fd)
    assert sorted(p.name for p in marker.parent.iterdir()) == []
    leftovers.remove_for(PID)
    assert not marker.parent.exists()


def test_another_users_entries_of_the_same_names_stay(node: tuple[Path, Path], attacker: User) -> None:  # noqa: F811
    shm, tmp = node
    theirs_dir = shm / f"{stop.DIR_PREFIX}{PID}-theirs"
    theirs_sock = tmp / f"_ft_launcher{PID}.socket"

    def make() -> None:
        theirs_dir.mkdir()
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).bind(str(theirs_sock))

    as_user(attacker, make)
    assert leftovers.remove_for(PID) == []
    assert theirs_dir.is_dir() and theirs_sock.exists()


def test_the_socket_names_are_nvrxs() -> None:
    """The names NVRx's launcher binds, read from the installed NVRx's source: a release that renames them
    fails here (leftovers would stay, nothing worse)."""
    import inspect

    from nvidia_resiliency_ext.fault_tolerance import launcher

    source = inspect.getsource(launcher)
    assert 'f"{tempfile.gettempdir()}/_ft_launcher{os.getpid()}.socket"' in source
    assert '_ft_launcher{os.getpid()}_rmon{local_rank}.socket"' in source
    pattern = leftovers.nvrx_sockets(1234)
    assert pattern.fullmatch("_ft_launcher1234.socket") and pattern.fullmatch("_ft_launcher1234_rmon7.socket")
    assert not pattern.fullmatch("_ft_launcher12345.socket") and not pattern.fullmatch("_ft_launcher1234_to_rmon.socket")
