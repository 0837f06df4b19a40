"""Every user mistake of issue 12 exits 2 naming the key or flag and the fix, without a traceback."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.cli.inproc import Result, invoke

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "examples" / "train_snapshot.py")


def refused(r: Result, *words: str) -> None:
    assert not r.crash, r.crash
    assert r.code == 2, r.text
    assert "Traceback" not in r.text
    for word in words:
        assert word in r.err, (word, r.err)


def dry(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return invoke(["run", *args, "--dry-run", SCRIPT], cwd=tmp_path, env=env)


def test_env_key_with_equals_sign_in_every_layer(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[launch.env]\n"A=B" = "x"\n')
    refused(dry(tmp_path, "-p", "p.toml"), "p.toml -> launch.env", "no '='")
    refused(dry(tmp_path, "--set", 'launch.env={"A=B" = "x"}'), "--set launch.env", "no '='")
    refused(dry(tmp_path, env={"RESCTL_LAUNCH_ENV": '{"A=B" = "x"}'}), "env RESCTL_LAUNCH_ENV", "no '='")


def test_nul_in_env_value_and_run_dir(tmp_path: Path) -> None:
    refused(dry(tmp_path, "--set", 'launch.env={A = "x\\u0000y"}'), "launch.env", "NUL")
    refused(dry(tmp_path, "--run-dir", "a\x00b"), "flag --run-dir -> launch.run_dir", "NUL")


def test_run_dir_naming_a_file(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("not a directory")
    for run_dir in ("taken", "taken/sub"):
        r = invoke(["run", "--run-dir", run_dir, SCRIPT], cwd=tmp_path)  # fails before anything starts
        refused(r, "launch.run_dir (flag --run-dir)", "is a file, not a directory", "--run-dir")


def test_run_dir_and_log_dir_under_proc(tmp_path: Path) -> None:
    refused(dry(tmp_path, "--run-dir", "/proc/x"), "flag --run-dir -> launch.run_dir", "pseudo-filesystem")
    refused(dry(tmp_path, "--log-dir", "/proc/x"), "flag --log-dir -> launch.log_dir", "pseudo-filesystem")
    (tmp_path / "p.toml").write_text('[launch]\nlog_dir = "/proc/x"\n')
    refused(invoke(["profile", "validate", "p.toml"], cwd=tmp_path), "p.toml -> launch.log_dir", "real storage")


def test_metrics_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        r = invoke(["run", "--run-dir", "rd", "--metrics-addr", "127.0.0.1", "--metrics-port", str(port), SCRIPT],
                   cwd=tmp_path)
    refused(r, f"launch.metrics_port (flag --metrics-port) = {port}", "pick a free port")


def test_metrics_addr_must_be_an_address(tmp_path: Path) -> None:
    refused(dry(tmp_path, "--metrics-addr", "everywhere"), "flag --metrics-addr -> launch.metrics_addr", "127.0.0.1")


def test_deep_nesting_in_set_and_env(tmp_path: Path) -> None:
    deep = "[" * 3000 + "]" * 3000
    refused(dry(tmp_path, "--set", f"launch.env={deep}"), "launch.env")
    refused(dry(tmp_path, env={"RESCTL_LAUNCH_ENV": deep}), "launch.env")
    refused(dry(tmp_path, env={"RESCTL_FAULTS": deep}), "RESCTL_FAULTS")


@pytest.mark.parametrize("plan", ['{"profile": "x"}', '{"profile": {"checkpoint": 3}}', '"x"', "[1]",
                                  "[" * 3000 + "]" * 3000, "{broken"])
def test_report_and_tune_interval_survive_a_damaged_plan(tmp_path: Path, plan: str) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "events-rank0.jsonl").write_text("".join(
        json.dumps({"t": 100.0 + i, "kind": "step", "rank": 0, "cycle": 0, "iteration": 0, "step": i}) + "\n"
        for i in range(1, 30)))
    (run / "plan.json").write_text(plan)
    for args in (["report", str(run)], ["tune-interval", "--from-run", str(run)]):
        r = invoke(args, cwd=tmp_path)
        assert not r.crash, (args, r.crash)
        assert r.code in (0, 2) and "Traceback" not in r.text, (args, r.text)


def test_launch_env_from_the_environment_merges_with_the_profile(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[launch.env]\nA = "1"\nB = "2"\n')
    r = dry(tmp_path, "-p", "p.toml", env={"RESCTL_LAUNCH_ENV": '{B = "3", C = "4"}'})
    assert r.code == 0, r.text
    assert {"A=1", "B=3", "C=4"} <= set(r.out.splitlines())
    shown = invoke(["profile", "show", "-p", "p.toml", "--json"], cwd=tmp_path, env={"RESCTL_LAUNCH_ENV": "{C = '4'}"})
    data = json.loads(shown.out)
    assert data["profile"]["launch"]["env"] == {"A": "1", "B": "2", "C": "4"}
    assert data["sources"]["launch.env"] == "p.toml + env RESCTL_LAUNCH_ENV"


def test_undecodable_bytes_in_variables_and_arguments(tmp_path: Path) -> None:
    # os.environ and sys.argv keep bytes that are not UTF-8 as lone surrogates; printing them used to crash.
    refused(dry(tmp_path, env={"RESCTL_LAUNCH_RUN_DIR": "a\udcffb"}), "env RESCTL_LAUNCH_RUN_DIR -> launch.run_dir",
            "not UTF-8")
    r = invoke(["run", "--dry-run", SCRIPT, "--x\udcff"], cwd=tmp_path)
    assert r.code == 0 and not r.crash and "--x\\udcff" in r.out


def test_a_bug_is_one_line_and_the_traceback_is_for_resctl_debug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import resctl.profile.load

    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(resctl.profile.load, "resolve", broken)
    r = invoke(["profile", "show"], cwd=tmp_path)
    assert r.code == 1 and "Traceback" not in r.text
    assert "internal error (a bug in resctl): RuntimeError: boom. Run again with RESCTL_DEBUG=1" in r.err
    r = invoke(["profile", "show"], cwd=tmp_path, env={"RESCTL_DEBUG": "1"})
    assert "RuntimeError: boom" in r.crash and "Traceback" in r.crash
