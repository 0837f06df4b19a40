"""Issue 12, end to end with a real ft_launcher job: secrets stay out of the run directory, the console and
--dry-run, while the workers still get them; a SIGTERM'd job saves, then exits 143 without a traceback."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.jobs import finish, start, wait_for

pytestmark = pytest.mark.slow

SECRETS = {
    "HF_TOKEN": "hfSECRETenv1",
    "DATABASE_URL": "postgres://app:pgSECRETenv2@db:5432/x",
    "GITHUB_PAT": "ghpSECRETenv3",
    "MYTOKEN": "mySECRETenv7",  # a secret name inside one word
    "WEBHOOK": "https://hooks.example/services/T0/B0/aB3dE6gH9jK2mN5pQ8rS1tU4",  # the secret is a path segment
}
RDZV_TOKEN = "rdzvSECRET4"
ARG_TOKEN = "argSECRET5"
URL_PASSWORD = "urlSECRET6"

# The worker proves it received every value, without printing one.
WORKER = """
import os, sys
want = {want!r}
ok = all(os.environ.get(k) == v for k, v in want.items())
ok = ok and sys.argv[1:] == ["--api-token", {arg!r}, "--source", "https://bob:{pw}@data/x"]
open(os.path.join({out!r}, "worker-ok" if ok else "worker-bad"), "w").close()
"""


def test_no_secret_value_reaches_the_run_dir_console_or_dry_run(tmp_path: Path) -> None:
    env_lines = "".join(f'{k} = "{v}"\n' for k, v in SECRETS.items())
    (tmp_path / "p.toml").write_text(f'[launch]\nnproc_per_node = 1\nrdzv_conf = {{ token = "{RDZV_TOKEN}" }}\n'
                                     f'[launch.env]\n{env_lines}FI_PROVIDER = "efa"\n')
    (tmp_path / "w.py").write_text(WORKER.format(want=SECRETS, arg=ARG_TOKEN, pw=URL_PASSWORD, out=str(tmp_path)))
    args = ["-p", "p.toml", "--run-dir", "rd", "--metrics-port", "0", "--metrics-addr", "127.0.0.1", "w.py",
            "--api-token", ARG_TOKEN, "--source", f"https://bob:{URL_PASSWORD}@data/x"]
    secrets = [*SECRETS.values(), RDZV_TOKEN, ARG_TOKEN, URL_PASSWORD, "pgSECRETenv2", "aB3dE6gH9jK2mN5pQ8rS1tU4"]

    dry = subprocess.run([sys.executable, "-m", "resctl", "run", "--dry-run", *args], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "FI_PROVIDER=efa" in dry.stdout and "HF_TOKEN='<redacted>'" in dry.stdout
    assert not [s for s in secrets if s in dry.stdout + dry.stderr], dry.stdout

    code, out = finish(start(args, cwd=tmp_path), timeout=180)
    assert code == 0, out[-4000:]
    assert (tmp_path / "worker-ok").exists(), "the worker did not get the secrets from the environment"
    assert not [s for s in secrets if s in out], out[-4000:]
    run_dir = tmp_path / "rd"
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "plan.json").stat().st_mode) == 0o600
    for path in run_dir.rglob("*"):
        if path.is_file():
            text = path.read_bytes().decode("utf-8", "replace")
            assert not [s for s in secrets if s in text], path
    assert "HF_TOKEN" in (run_dir / "plan.json").read_text()  # the names stay: what the run was given

    shown = subprocess.run([sys.executable, "-m", "resctl", "profile", "show", "-p", "p.toml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
    assert shown.returncode == 0 and "HF_TOKEN" in shown.stdout
    assert not [s for s in secrets if s in shown.stdout + shown.stderr], shown.stdout


SAVER = """
import time, torch
import resctl.checkpoint as ck
model = torch.nn.Linear(2, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
state = {"model": model, "opt": opt}
step = ck.load(state)
while True:
    step += 1
    opt.zero_grad(); model(torch.ones(1, 2)).sum().backward(); opt.step()
    ck.maybe_save(state, step)
    time.sleep(0.02)
"""


def test_sigterm_saves_then_exits_143_without_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "saver.py").write_text(SAVER)
    ckpt = tmp_path / "ck"
    proc = start(["--nproc-per-node", "1", "--run-dir", "rd", "--set", f"checkpoint.dir={ckpt}",
                  "--set", "checkpoint.interval_steps=1000", "saver.py"], cwd=tmp_path)
    from tests.integration.jobs import last_step

    wait_for(lambda: last_step(tmp_path / "rd", 0) >= 20, 120, "step 20", proc)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, timeout=90)
    assert code == 143, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    saved = sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step-"))
    assert saved, f"no final checkpoint on SIGTERM: {list(ckpt.iterdir())}"  # interval 1000: only the SIGTERM save


FAILING = """
raise RuntimeError("cannot fetch https://bob:hf_excSECRET81abcdef@hub.example/x?token=excSECRET82&page=2")
"""


def resctl_own_lines(console: str) -> list[str]:
    """What resctl itself printed: its `resctl:` lines and the failure summary (from "resctl: the job
    failed" on, its indented lines included). The script's own stderr (here Python's traceback of
    the uncaught exception, indented too) reaches the console unchanged, as under torchrun."""
    lines = console.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("resctl: the job failed")), len(lines))
    return [line for line in lines[:start] if line.startswith("resctl:")] + lines[start:]


def test_secrets_in_an_exception_stay_out_of_events_logs_and_the_summary(tmp_path: Path) -> None:
    """Issue 27 item 7: a worker's exception quoting a URL with its credentials is masked everywhere
    resctl writes or prints it (events, the launcher's log, the failure summary, `resctl report`);
    the script's own stderr and `logs/` are the script's and stay as it wrote them."""
    (tmp_path / "fail.py").write_text(FAILING)
    code, out = finish(start(["--nproc-per-node", "1", "--run-dir", "rd", "--set", "launch.max_restarts=0",
                              "fail.py"], cwd=tmp_path), timeout=120)
    assert code != 0
    own = resctl_own_lines(out)
    summary = "\n".join(own)
    assert "resctl: the job failed" in summary and "RuntimeError" in summary, out[-3000:]  # names the fault ...
    assert "excSECRET8" not in summary, summary  # ... without its secrets
    assert "https://bob:<redacted>@hub.example/x?token=<redacted>&page=2" in summary, summary
    assert "excSECRET81" in out  # the script's own traceback, printed by its interpreter: not resctl's to change
    run_dir = tmp_path / "rd"
    for path in run_dir.rglob("*"):
        if path.is_file() and "logs" not in path.relative_to(run_dir).parts:  # logs/: what the script printed
            assert "excSECRET8" not in path.read_text(errors="replace"), path
    events = (run_dir / "events-rank0.jsonl").read_text()
    assert "hub.example" in events and "<redacted>" in events
    assert "hub.example" in (run_dir / "launcher.log").read_text()  # the launcher logged the error, masked
    for extra in ([], ["--json"]):
        report = subprocess.run([sys.executable, "-m", "resctl", "report", "rd", *extra], cwd=tmp_path,
                                capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "300"})
        assert report.returncode == 0, report.stderr
        assert "excSECRET8" not in report.stdout + report.stderr, report.stdout
