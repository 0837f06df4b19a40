"""`resctl doctor` as a user runs it on this CPU machine: real subprocesses, --json, exit codes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
NODES = REPO / "tests" / "fixtures" / "nodes"
DOC = (REPO / "docs" / "doctor.md").read_text()

TOP_KEYS = {"schema", "resctl_version", "host", "root", "started", "duration_s", "deep", "strict", "status",
            "exit_code", "counts", "expectations", "probes"}
PROBE_KEYS = {"name", "status", "duration_s", "timed_out", "checks"}
CHECK_KEYS = {"name", "status", "measured", "expected", "unit", "message", "fix"}
STATUSES = {"PASS", "WARN", "FAIL", "SKIP"}


def doctor(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resctl", "doctor", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=60)


def assert_schema(doc: dict) -> None:
    assert set(doc) == TOP_KEYS and doc["schema"] == "resctl.doctor/1"
    assert doc["status"] in STATUSES and set(doc["counts"]) == STATUSES
    assert isinstance(doc["duration_s"], float) and isinstance(doc["expectations"], dict)
    for probe in doc["probes"]:
        assert set(probe) == PROBE_KEYS and probe["status"] in STATUSES and probe["checks"]
        for c in probe["checks"]:
            assert set(c) == CHECK_KEYS and c["status"] in STATUSES and isinstance(c["message"], str)
            assert c["measured"] is None or isinstance(c["measured"], (int, float, str, bool))
            assert c["expected"] is None or isinstance(c["expected"], (int, float, str, bool))
    statuses = [c["status"] for p in doc["probes"] for c in p["checks"]]
    assert sum(doc["counts"].values()) == len(statuses)
    assert doc["exit_code"] == (1 if "FAIL" in statuses or (doc["strict"] and "WARN" in statuses) else 0)


def test_json_schema_is_documented() -> None:
    for key in TOP_KEYS | PROBE_KEYS | CHECK_KEYS:
        assert f"`{key}`" in DOC, f"docs/doctor.md does not document the JSON key {key!r}"


def test_this_cpu_machine(tmp_path: Path) -> None:
    out = doctor("--json", "--storage-mb", "8", "--dir", str(tmp_path), cwd=tmp_path)
    assert "Traceback" not in out.stderr
    doc = json.loads(out.stdout)
    assert_schema(doc)
    assert out.returncode == doc["exit_code"]
    probes = {p["name"]: p for p in doc["probes"]}
    assert list(probes) == ["gpu", "nvlink", "efa", "storage", "shm", "memlock", "env", "dns", "clock", "memory", "grace"]
    for name in ("gpu", "nvlink", "efa"):  # no driver, no RDMA here
        assert probes[name]["status"] == "SKIP", probes[name]
    checks = {c["name"]: c for c in probes["storage"]["checks"]}
    assert checks["write"]["status"] == "PASS" and checks["write"]["measured"] > 0
    assert checks["read"]["measured"] > 0 and checks["space"]["measured"] > 0
    assert probes["shm"]["checks"][0]["measured"] > 0
    assert probes["memlock"]["checks"][0]["measured"]
    assert not list(tmp_path.glob(".resctl-doctor-*"))


def test_strict_only_skip_and_usage_errors(tmp_path: Path) -> None:
    out = doctor("--json", "--only", "shm,memlock", "--strict", cwd=tmp_path)
    doc = json.loads(out.stdout)
    assert [p["name"] for p in doc["probes"]] == ["shm", "memlock"] and doc["strict"] is True
    assert out.returncode == doc["exit_code"]
    out = doctor("--json", "--skip", "storage", "--skip", "dns,clock", cwd=tmp_path)
    assert {p["name"] for p in json.loads(out.stdout)["probes"]} == {"gpu", "nvlink", "efa", "shm", "memlock",
                                                                     "env", "memory", "grace"}
    bad = doctor("--only", "gpuu", cwd=tmp_path)
    assert bad.returncode == 2 and "did you mean gpu?" in bad.stderr and "Traceback" not in bad.stderr
    bad = doctor("--set", "doctor.gpus=-1", cwd=tmp_path)
    assert bad.returncode == 2 and "doctor.gpus" in bad.stderr and "Traceback" not in bad.stderr
    bad = doctor("--root", str(tmp_path / "nope"), cwd=tmp_path)
    assert bad.returncode == 2 and "not a directory" in bad.stderr


def test_fixture_node_through_the_cli(tmp_path: Path) -> None:
    root = tmp_path / "node"
    shutil.copytree(NODES / "p5-healthy", root)
    shutil.copytree(NODES / "p5-missing-gpu", root, dirs_exist_ok=True)
    args = ("--root", str(root), "--set", "checkpoint.dir=/fsx/checkpoints", "--storage-mb", "2",
            "--skip", "dns,clock", "--set", "doctor.checkpoint_size_gb=10")
    env = {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1"}
    out = doctor("--json", *args, cwd=tmp_path, env=env)
    doc = json.loads(out.stdout)
    assert_schema(doc)
    assert out.returncode == 1 and doc["status"] == "FAIL" and doc["counts"]["FAIL"] == 1
    gpu = doc["probes"][0]["checks"][0]
    assert (gpu["name"], gpu["status"], gpu["measured"], gpu["expected"]) == ("count", "FAIL", 7, 8)
    table = doctor(*args, cwd=tmp_path, env=env)
    assert table.returncode == 1 and table.stdout == ""  # the table is talk: stderr
    assert "7 of 8 GPUs visible" in table.stderr and "NOT FIT" in table.stderr


def test_doctor_does_not_import_torch(tmp_path: Path) -> None:
    code = ("import runpy, sys; sys.argv = ['resctl', 'doctor', '--json', '--storage-mb', '1', '--skip', 'dns'];\n"
            "try:\n runpy.run_module('resctl', run_name='__main__')\nexcept SystemExit: pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.stderr.strip().endswith("NO-TORCH"), out.stderr[-500:]
