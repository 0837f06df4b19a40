"""Which profile file resctl loads is said on stderr; a working directory's resctl.toml others could write is refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.inproc import invoke

SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_snapshot.py")


def test_the_loaded_profile_is_announced(tmp_path: Path) -> None:
    r = invoke(["run", "--dry-run", SCRIPT], cwd=tmp_path)
    assert r.code == 0 and "resctl: no profile file: built-in defaults" in r.err
    (tmp_path / "resctl.toml").write_text("[launch]\nmax_restarts = 5\n")
    os.chmod(tmp_path / "resctl.toml", 0o644)
    for args in (["run", "--dry-run", SCRIPT], ["profile", "show"]):
        r = invoke(args, cwd=tmp_path)
        assert r.code == 0, r.text
        lines = [line for line in r.err.splitlines() if line.startswith("resctl: profile ")]
        assert lines == [f"resctl: profile {tmp_path / 'resctl.toml'} (found in the working directory; "
                         "-p FILE to choose another)"], r.err
    r = invoke(["run", "--dry-run", SCRIPT], cwd=tmp_path, env={"RESCTL_PROFILE": str(tmp_path / "resctl.toml")})
    assert "(from env RESCTL_PROFILE)" in r.err


def test_a_world_writable_working_directory_profile_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "resctl.toml"
    path.write_text('[launch.env]\nPYTHONPATH = "/tmp/evil"\n')
    os.chmod(path, 0o666)
    r = invoke(["run", "--dry-run", SCRIPT], cwd=tmp_path)
    assert r.code == 2 and not r.crash and "anyone on this machine can write it" in r.err and f"-p {path}" in r.err
    assert "PYTHONPATH" not in r.out
    r = invoke(["run", "-p", str(path), "--dry-run", SCRIPT], cwd=tmp_path)  # named explicitly: trusted
    assert r.code == 0 and "PYTHONPATH=/tmp/evil" in r.out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_working_directory_profile_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "resctl.toml"
    path.write_text("[launch]\nmax_restarts = 5\n")
    os.chown(path, 54321, 54321)
    r = invoke(["profile", "show"], cwd=tmp_path)
    assert r.code == 2 and "owned by another user (uid 54321)" in r.err
