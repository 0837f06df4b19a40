"""Secrets never reach the console: --dry-run, profile show and error messages (fast, in-process; the end-to-end
run is tests/integration/test_secrets.py)."""

from __future__ import annotations

import json
import stat
import urllib.request
from pathlib import Path

from resctl.launch import execute
from resctl.launch.plan import Target
from resctl.profile.load import Layer
from tests.cli.inproc import invoke

SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_snapshot.py")
PROFILE = """[launch]
rdzv_conf = { join_timeout = "60", store_token = "SECr1" }
[launch.env]
HF_TOKEN = "SECe1"
WANDB_API_KEY = "SECe2"
GITHUB_PAT = "SECe3"
DATABASE_URL = "postgres://app:SECe4@db:5432/x"
FI_PROVIDER = "efa"
"""


def test_dry_run_redacts_by_name_shape_rdzv_conf_and_arguments(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PROFILE)
    r = invoke(["run", "-p", "p.toml", "--rdzv-conf", "token=SECr2,join_timeout=60", "--dry-run", SCRIPT,
                "--api-token", "SECa1", "--hub-token=SECa2", "--data", "s3://AKIAABCDEFGHIJKLMNOP:SECa3@bucket/x",
                "--lr", "3e-4"], cwd=tmp_path)
    assert r.code == 0, r.text
    assert "SEC" not in r.text, [line for line in r.text.splitlines() if "SEC" in line]
    assert "FI_PROVIDER=efa" in r.out and "--lr 3e-4" in r.out and "join_timeout=60" in r.out
    assert "DATABASE_URL='postgres://app:<redacted>@db:5432/x'" in r.out


def test_profile_show_redacts(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PROFILE)
    table = invoke(["profile", "show", "-p", "p.toml"], cwd=tmp_path)
    shown = invoke(["profile", "show", "-p", "p.toml", "--json"], cwd=tmp_path)
    assert table.code == shown.code == 0
    assert "SEC" not in table.text + shown.text and "HF_TOKEN" in table.out
    env = json.loads(shown.out)["profile"]["launch"]["env"]
    assert env["FI_PROVIDER"] == "efa" and env["HF_TOKEN"] == "<redacted>"


def test_error_messages_redact(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text(PROFILE + 'BAD = "x\\u0000"\n[launch.rdzv_conf_typo]\n')
    r = invoke(["profile", "validate", "p.toml"], cwd=tmp_path)
    assert r.code == 2 and "NUL" in r.err and "SEC" not in r.text
    r = invoke(["run", "--rdzv-conf", "token", "--dry-run", SCRIPT], cwd=tmp_path)
    assert r.code == 2 and "--rdzv-conf: 'token' is not KEY=VALUE" in r.err


def test_run_dir_is_private_and_metrics_listen_where_asked(tmp_path: Path) -> None:
    flags = Layer("flags", {"launch.run_dir": str(tmp_path / "rd"), "launch.metrics_port": 0,
                            "launch.metrics_addr": "127.0.0.1"})
    (tmp_path / "p.toml").write_text(PROFILE)
    _, launch_plan = execute.prepare(tmp_path / "p.toml", flags, [], Target(SCRIPT))
    execute.write_files(launch_plan)
    assert stat.S_IMODE((tmp_path / "rd").stat().st_mode) == 0o700
    plan_file = tmp_path / "rd" / "plan.json"
    assert stat.S_IMODE(plan_file.stat().st_mode) == 0o600 and "SEC" not in plan_file.read_text()
    where = execute.serve_metrics(launch_plan)
    host, port = where.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    body = urllib.request.urlopen(f"http://{where}/metrics", timeout=10).read().decode()
    assert "resctl_" in body


def test_profile_show_masks_credentials_in_any_string_key(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[checkpoint]\ndir = "s3://u:SECd1@bucket/ck"\n[heartbeat.sections]\nauth = "5m"\n')
    for args in (["profile", "show", "-p", "p.toml"], ["profile", "show", "-p", "p.toml", "--json"]):
        r = invoke(args, cwd=tmp_path)
        assert r.code == 0 and "SEC" not in r.text and "s3://u:<redacted>@bucket/ck" in r.out, r.text
    assert json.loads(r.out)["profile"]["heartbeat"]["sections"] == {"auth": 300.0}  # numbers are not masked
