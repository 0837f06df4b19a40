"""The stop sequence nests (final save < launcher term timeout < scheduler grace): `resctl profile validate`,
the doctor's grace probe, and the dns probe's bounded wait for the rendezvous host."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resctl.doctor import dns, make_context
from resctl.doctor import grace as grace_probe
from resctl.doctor.result import Status
from resctl.profile import grace
from resctl.profile.load import resolve

REPO = Path(__file__).resolve().parents[2]


def profile(tmp_path: Path, *sets: str):  # type: ignore[no-untyped-def]
    return resolve(None, env={}, sets=list(sets), cwd=tmp_path).profile


@pytest.mark.parametrize("save,term,pod,bad", [
    ("90s", "120s", 180.0, []),
    ("90s", "60s", 120.0, ["checkpoint.sigterm_grace"]),               # the ConfigMap
    ("90s", "120s", 120.0, ["launch.term_timeout"]),
    ("120s", "120s", 100.0, ["checkpoint.sigterm_grace", "launch.term_timeout"]),
    ("30s", "60s", None, []),                                          # defaults, no scheduler known
])
def test_problems_name_each_pair_that_does_not_nest(tmp_path: Path, save: str, term: str, pod, bad) -> None:  # type: ignore[no-untyped-def]
    p = profile(tmp_path, f"checkpoint.sigterm_grace={save}", f"launch.term_timeout={term}")
    found = grace.problems(p, "prod.toml", pod)
    assert [f.key for f in found] == bad
    assert all(f.source == "prod.toml" and f.fix for f in found)


def test_no_final_save_no_first_pair(tmp_path: Path) -> None:
    p = profile(tmp_path, "checkpoint.save_on_sigterm=false", "checkpoint.sigterm_grace=90s", "launch.term_timeout=60s")
    assert grace.problems(p, "x") == []


@pytest.mark.parametrize("raw,value,n_bad", [("150", 150.0, 0), (" 30 ", 30.0, 0), ("", None, 0), ("0", None, 1),
                                             ("2m", None, 1), ("-5", None, 1),
                                             ("nan", None, 1), ("inf", None, 1)])
def test_scheduler_grace_from_env(raw: str, value, n_bad: int) -> None:  # type: ignore[no-untyped-def]
    got, bad = grace.scheduler_grace({grace.GRACE_ENV: raw})
    assert got == value and len(bad) == n_bad


def test_profile_validate_exits_2_naming_file_key_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "prod.toml"
    path.write_text('[launch]\nterm_timeout = "60s"\n[checkpoint]\nsigterm_grace = "90s"\n')
    proc = subprocess.run([sys.executable, "-m", "resctl", "profile", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"{path} -> checkpoint.sigterm_grace" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("name", ["eks-p5.toml", "slurm-p5.toml", "local-cpu.toml"])
def test_shipped_profiles_nest(name: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "resctl", "profile", "validate", str(REPO / "examples" / "profiles" / name)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_doctor_grace_probe_reads_the_pod_grace(tmp_path: Path) -> None:
    p = profile(tmp_path, "checkpoint.sigterm_grace=90s", "launch.term_timeout=120s")
    ok = grace_probe.run(make_context(p, env={grace.GRACE_ENV: "180"}))
    assert [c.status for c in ok] == [Status.PASS] and "scheduler 180s" in ok[0].message
    short = grace_probe.run(make_context(p, env={grace.GRACE_ENV: "100"}))
    assert [c.status for c in short] == [Status.FAIL] and "terminationGracePeriodSeconds" in short[0].fix
    unknown = grace_probe.run(make_context(p, env={}))
    assert unknown[0].status == Status.PASS and grace.GRACE_ENV in unknown[0].message


def _indexed_job_ctx(tmp_path: Path, wait: str):  # type: ignore[no-untyped-def]
    p = profile(tmp_path, "launch.nnodes=2", "launch.k8s_service=svc", f"doctor.dns_wait={wait}")
    return make_context(p, env={"JOB_COMPLETION_INDEX": "1", "POD_NAMESPACE": "ns", "JOB_NAME": "job"})


def test_dns_waits_for_rank0_to_be_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    published_at = time.monotonic() + 1.2  # pod 0 gets its address a little after this pod starts
    real = socket.getaddrinfo

    def cluster_dns(host, *args, **kw):  # type: ignore[no-untyped-def]
        if host == "job-0.svc.ns.svc.cluster.local":
            if time.monotonic() < published_at:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return real("127.0.0.1", *args, **kw)
        return real(host, *args, **kw)

    monkeypatch.setattr(dns.socket, "getaddrinfo", cluster_dns)
    checks = {c.name: c for c in dns.run(_indexed_job_ctx(tmp_path, "30s"))}
    assert checks["rendezvous"].status == Status.PASS and "after" in checks["rendezvous"].message


def test_dns_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def never(host, *args, **kw):  # type: ignore[no-untyped-def]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(dns.socket, "getaddrinfo", never)
    t0 = time.monotonic()
    checks = {c.name: c for c in dns.run(_indexed_job_ctx(tmp_path, "2s"))}
    waited = time.monotonic() - t0
    assert checks["rendezvous"].status == Status.FAIL and "within doctor.dns_wait = 2s" in checks["rendezvous"].message
    assert 1.0 <= waited < 5.0
    once = {c.name: c for c in dns.run(_indexed_job_ctx(tmp_path, "0s"))}
    assert once["rendezvous"].status == Status.FAIL and "dns_wait" not in once["rendezvous"].message
