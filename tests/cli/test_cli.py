"""The command line as a new user meets it: real subprocesses, exit codes, messages."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "train_snapshot.py"


def resctl(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`resctl ARGS`; the timeout only guards against a hang (a job with its preflight took over 60 s on the
    2-core VM beside CPU burners and another suite)."""
    import os

    return subprocess.run([sys.executable, "-m", "resctl", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=300)


def test_help_and_version(tmp_path: Path) -> None:
    out = resctl("--help", cwd=tmp_path)
    assert out.returncode == 0 and "run" in out.stdout and "Example:" in out.stdout
    assert resctl("--version", cwd=tmp_path).stdout.startswith("resctl ")
    for command in (["run"], ["profile", "show"], ["profile", "init"], ["profile", "validate"], ["doctor"],
                    ["report"], ["tune-interval"]):
        page = resctl(*command, "--help", cwd=tmp_path)
        assert page.returncode == 0 and "Example" in page.stdout, command


def test_help_does_not_import_torch(tmp_path: Path) -> None:
    code = "import runpy, sys; sys.argv = ['resctl', '--help'];\ntry:\n runpy.run_module('resctl', run_name='__main__')\n" \
           "except SystemExit: pass\nprint('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.stderr.strip().endswith("NO-TORCH")


def bad(tmp_path: Path, profile_text: str | None, *args: str) -> str:
    extra: list[str] = []
    if profile_text is not None:
        (tmp_path / "p.toml").write_text(profile_text)
        extra = ["-p", "p.toml"]
    out = resctl("run", *extra, *args, "--dry-run", str(SCRIPT), cwd=tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    return out.stderr


def test_missing_script(tmp_path: Path) -> None:
    out = resctl("run", "nope.py", cwd=tmp_path)
    assert out.returncode == 2 and "training script not found: nope.py" in out.stderr and "Traceback" not in out.stderr


def test_malformed_toml(tmp_path: Path) -> None:
    assert "p.toml: not valid TOML" in bad(tmp_path, "[launch\n")


def test_unknown_key(tmp_path: Path) -> None:
    msg = bad(tmp_path, "[launch]\nmax_restart = 3\n")
    assert "p.toml -> launch.max_restart: unknown key" in msg and "did you mean 'launch.max_restarts'" in msg


def test_wrong_type(tmp_path: Path) -> None:
    msg = bad(tmp_path, '[launch]\nmax_restarts = "many"\n')
    assert "p.toml -> launch.max_restarts" in msg and "'many'" in msg


def test_negative_timeout(tmp_path: Path) -> None:
    msg = bad(tmp_path, '[heartbeat]\ntimeout = "-5s"\n')
    assert "heartbeat.timeout" in msg and "negative" in msg and "fix:" in msg


def test_heartbeat_timeout_shorter_than_monitor_interval(tmp_path: Path) -> None:
    msg = bad(tmp_path, '[heartbeat]\ntimeout = "2s"\ncheck_interval = "5s"\n')
    assert "must be longer than heartbeat.check_interval" in msg


def test_bad_set_and_env(tmp_path: Path) -> None:
    assert "did you mean 'heartbeat.timeout'" in bad(tmp_path, None, "--set", "heartbeat.timout=3")
    out = resctl("run", "--dry-run", str(SCRIPT), cwd=tmp_path, env={"RESCTL_LAUNCH_MAX_RESTART": "2"})
    assert out.returncode == 2 and "RESCTL_LAUNCH_MAX_RESTARTS" in out.stderr


def test_dry_run_shows_command_env_and_sources(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[launch]\nmax_restarts = 7\n[launch.env]\nHF_TOKEN = "hf_abc"\nFI_PROVIDER = "efa"\n')
    out = resctl("run", "-p", "p.toml", "--nproc_per_node", "4", "--set", "heartbeat.timeout=10m",
                 "--dry-run", str(SCRIPT), "--lr", "1", cwd=tmp_path, env={"RESCTL_LAUNCH_TERM_TIMEOUT": "45s"})
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "-m resctl.launch.ft_entry" in text and f"{SCRIPT} --lr 1" in text
    assert "HF_TOKEN='<redacted>'" in text and "hf_abc" not in text and "FI_PROVIDER=efa" in text
    assert "--max-restarts 7" in text and "<- p.toml" in text
    assert "--nproc-per-node 4" in text and "<- flag --nproc-per-node" in text
    assert "--ft-rank-heartbeat-timeout 600" in text and "<- --set heartbeat.timeout" in text
    assert "--term-timeout 45" in text and "<- env RESCTL_LAUNCH_TERM_TIMEOUT" in text
    assert not list(tmp_path.glob("resctl-runs/*")), "--dry-run writes nothing"


def test_profile_commands(tmp_path: Path) -> None:
    assert resctl("profile", "init", cwd=tmp_path).returncode == 0
    assert (tmp_path / "resctl.toml").exists()
    assert resctl("profile", "init", cwd=tmp_path).returncode == 2, "refuses to overwrite"
    assert resctl("profile", "validate", "resctl.toml", cwd=tmp_path).returncode == 0
    (tmp_path / "resctl.toml").write_text("[launch]\nnproc_per_node = 3\n")
    shown = json.loads(resctl("profile", "show", "--json", cwd=tmp_path).stdout)
    assert shown["profile"]["launch"]["nproc_per_node"] == "3"
    assert shown["sources"]["launch.nproc_per_node"].endswith("resctl.toml")
    table = resctl("profile", "show", "--set", "launch.max_restarts=4", cwd=tmp_path).stdout
    assert "launch.max_restarts" in table and "--set launch.max_restarts" in table


@pytest.mark.parametrize("name", ["resctl.bash", "_resctl", "resctl.fish"])
def test_completions_match_the_cli(name: str) -> None:
    from resctl.cli.completions import FILES

    assert (REPO / "completions" / name).read_text() == FILES[name](), \
        "completions are stale: run `python -m resctl.cli.completions completions`"


@pytest.mark.slow
@pytest.mark.nvrx_series("0.4")  # in-process restart: NVRx 0.4 only (docs/recovery.md, issue 30)
def test_preflight_judges_the_workers_environment(tmp_path: Path) -> None:
    """In-process restart on: the plan sets NCCL_NVLS_ENABLE=0 for the workers, so preflight passes
    on this CPU box (it used to refuse every in-process job) and the job runs."""
    (tmp_path / "ok.py").write_text("print('worker ran')\n")
    out = resctl("run", "--preflight", "--set", "inprocess.enabled=true", "--set", "doctor.storage_test_mb=0",
                 "--nproc-per-node", "1", "--run-dir", str(tmp_path / "run"), "ok.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "preflight ok" in out.stderr and "worker ran" in out.stdout


def test_preflight_failure_launches_nothing(tmp_path: Path) -> None:
    out = resctl("run", "--preflight", "--set", "doctor.gpus=8", "--set", "doctor.storage_test_mb=8",
                 "--run-dir", str(tmp_path / "run"), str(SCRIPT), cwd=tmp_path)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "preflight failed: not launching" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists(), "no launcher was started"
