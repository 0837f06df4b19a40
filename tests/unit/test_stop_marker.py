"""The restart-stop marker under attack by another local user (issue 27, item 1): a planted marker
must not turn a real SIGTERM into a restart stop (no final save), and the launcher must write
through no link another user planted."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from resctl.launch import stop
from tests.attacker import User, as_user, attacker  # noqa: F401 - the fixture

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm")


def test_planted_marker_and_link_at_the_old_names_have_no_effect(attacker: User, tmp_path: Path) -> None:  # noqa: F811
    launcher_pid, worker = 4_000_000 + os.getpid() % 100_000, os.getpid()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    old = SHM / f"resctl-stop-{launcher_pid}"

    def plant() -> None:
        old.write_text(f"{worker} 1 2 3")
        (SHM / f"resctl-stop-{launcher_pid}.tmp").symlink_to(victim)

    try:
        as_user(attacker, plant)
        marker = stop.file_for(launcher_pid)
        assert marker.parent != SHM and marker.parent.name.startswith(f"resctl-stop-{launcher_pid}-")
        info = marker.parent.lstat()
        assert info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) == 0o700
        env = {stop.ENV: str(marker)}
        assert not stop.is_restart_stop(env, worker), "nothing marked yet: a SIGTERM is a job stop"
        stop.mark_restart(marker, [worker])
        assert stop.is_restart_stop(env, worker)
        assert victim.read_text() == "precious"
        assert stat.S_IMODE(marker.stat().st_mode) == 0o600
        stop.remove(marker)
        assert not marker.parent.exists()
    finally:
        for name in (old, SHM / f"resctl-stop-{launcher_pid}.tmp"):
            name.unlink(missing_ok=True)


def test_the_private_directory_refuses_another_user(attacker: User) -> None:  # noqa: F811
    marker = stop.file_for(os.getpid())
    try:
        def plant_link() -> None:
            with pytest.raises(PermissionError):
                (marker.parent / "marker.tmp").symlink_to("/etc/passwd")
            with pytest.raises(PermissionError):
                marker.write_text(str(os.getppid()))

        as_user(attacker, plant_link)
    finally:
        stop.remove(marker)


def test_a_marker_of_another_user_or_behind_a_link_is_not_believed(attacker: User, tmp_path: Path) -> None:  # noqa: F811
    me = os.getpid()
    theirs = SHM / f"resctl-attack-{me}"

    def plant() -> None:
        theirs.mkdir(mode=0o700)
        (theirs / "marker").write_text(str(me))
        theirs.chmod(0o777)

    try:
        as_user(attacker, plant)
        assert not stop.is_restart_stop({stop.ENV: str(theirs / "marker")}, me), "another user's marker"
        mine = stop.file_for(me)
        (tmp_path / "real").write_text(str(me))
        mine.symlink_to(tmp_path / "real")
        assert not stop.is_restart_stop({stop.ENV: str(mine)}, me), "a marker behind a link"
        stop.remove(mine)
    finally:
        for p in theirs.glob("*"):
            p.unlink()
        if theirs.exists():
            theirs.rmdir()


def test_left_workers_are_read_by_pid_and_only_when_this_user_wrote_them(attacker: User) -> None:  # noqa: F811
    marker = stop.file_for(os.getpid())
    try:
        stop.mark_left({stop.ENV: str(marker)}, 4242, stop.PEER)
        stop.mark_left({stop.ENV: str(marker)}, 4343, stop.OWN)
        (marker.parent / "left-5151").write_text("something else")  # not a way of leaving: not believed
        stop.mark_saving({stop.ENV: str(marker)}, 4242)
        assert stop.left(marker) == {stop.OWN, stop.PEER}
        assert stop.saving_after_a_stop({4343: 143, 4242: None}, marker)
        assert not stop.saving_after_a_stop({5151: 143, 4242: None}, marker)  # 5151 is not believed to have left
        stop.clear_left(marker)
        assert stop.left(marker) == set() and not stop.saving_after_a_stop({4343: 143, 4242: None}, marker)
    finally:
        stop.remove(marker)


def test_workers_that_left_on_a_stop_while_others_save_are_no_failure() -> None:
    marker = stop.file_for(os.getpid())
    try:
        for pid in (10, 11, 12):
            stop.mark_left({stop.ENV: str(marker)}, pid, stop.PEER)
        stop.mark_saving({stop.ENV: str(marker)}, 12)
        assert stop.saving_after_a_stop({10: 143, 12: None}, marker)  # 10 saved and left; 12 is still saving
        assert stop.saving_after_a_stop({10: 143, 11: 143, 12: None}, marker)
        assert not stop.saving_after_a_stop({10: 143, 12: 143}, marker)  # all gone: the stop is over
        assert not stop.saving_after_a_stop({10: 143, 13: 1, 12: None}, marker)  # 13 failed without leaving
        assert not stop.saving_after_a_stop({10: None, 12: None}, marker)  # nobody gone yet
        assert not stop.saving_after_a_stop({10: 0, 12: None}, marker)  # a clean end is no stop
        # A rank with no step boundary (no checkpointing) leaves on the stop but saves nothing: a SIGTERM to
        # one such worker fails the job at once, as under torchrun (compat case sig_term_default).
        assert not stop.saving_after_a_stop({10: 143, 11: None}, marker)
    finally:
        stop.remove(marker)


def test_the_restart_clock_goes_to_the_next_cycles_workers_once() -> None:
    """Failure seen, then stopped: both times, in order, into every new worker's environment; a peer's restart
    (no failure here) is seen at its stop; a first start and the cycle after a handed one get nothing."""
    from resctl.launch.stop import RestartClock
    from resctl.profile import contract

    clock = RestartClock()
    first: list[dict[str, str]] = [{}, {}]
    clock.hand_to(first)
    assert first == [{}, {}]
    clock.failed()
    clock.failed()  # a later look at the same failed cycle: the first one counts
    clock.stopping()
    clock.stopped()
    envs: list[dict[str, str]] = [{}, {}]
    clock.hand_to(envs)
    times = [contract.restart_clock(env) for env in envs]
    assert times[0] == times[1] and times[0] is not None and times[0][0] <= times[0][1]
    again: list[dict[str, str]] = [{}]
    clock.hand_to(again)
    assert again == [{}]
    clock.stopping()  # another node's restart
    clock.stopped()
    peer: list[dict[str, str]] = [{}]
    clock.hand_to(peer)
    assert contract.restart_clock(peer[0]) is not None
    assert contract.restart_clock({contract.RESTART_CLOCK: "1.0"}) is None  # not two times: none
