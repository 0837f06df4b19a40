"""The same unmodified scripts under torchrun, `resctl run` (forked workers) and `resctl run` with
exec'd workers: the same exit codes and the same output lines (`FACT ...`) of the script.

The scripts are in tests/integration/parity/. Intended differences (README, "Differences from
torchrun") are asserted as such: a job stopped by SIGINT/SIGTERM exits 128+N under resctl, 1 under
torchrun.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "parity"
LAUNCHERS = ("torchrun", "fork", "exec")


@dataclass
class Run:
    code: int
    out: str

    @property
    def facts(self) -> list[str]:
        """The script's FACT lines, up to resctl's failure summary (which quotes the worker's error)."""
        out = re.split(r"^resctl: (?:the job failed|stopped by)", self.out, maxsplit=1, flags=re.M)[0]
        # Anywhere in a line: warnings prefix them, and two workers can share a line.
        return sorted(re.findall(r"FACT [^\n]*?(?=FACT |\n|$)", out))


def command(launcher: str, script: str, args: list[str], nproc: int, run_dir: Path) -> list[str]:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), script, *args]
    start = [] if launcher == "fork" else ["--set", 'launch.worker_start="exec"']
    return [sys.executable, "-m", "resctl", "run", "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "--run-dir", str(run_dir), *start, script, *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESCTL_", "TORCHELASTIC_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def launch(launcher: str, tmp_path: Path, script: str, *args: str, nproc: int = 1, stdin: str = "") -> Run:
    cwd = tmp_path / launcher
    cwd.mkdir(exist_ok=True)
    (cwd / script).write_text((SCRIPTS / script).read_text())
    proc = subprocess.run(command(launcher, script, list(args), nproc, cwd / "run"), cwd=cwd, env=_env(),
                          input=stdin, capture_output=True, text=True, timeout=150)
    return Run(proc.returncode, proc.stdout + proc.stderr)


def test_a_worker_sees_a_new_interpreter(tmp_path: Path) -> None:
    runs = {name: launch(name, tmp_path, "facts.py", nproc=2, stdin="hello\n") for name in LAUNCHERS}
    for name, run in runs.items():
        assert run.code == 0, f"{name}:\n{run.out[-3000:]}"
        rngs = re.findall(r"RNG rank \d ([\d.e-]+) ([\d.e-]+) ([\d.e-]+)", run.out)
        assert len(rngs) == 2 and all(a != b for a, b in zip(*rngs)), f"{name}: ranks share a random stream: {rngs}"
    expected = runs["torchrun"].facts
    assert len(expected) == 2 * 11, expected  # the warning shows its source line too
    assert runs["fork"].facts == expected
    assert runs["exec"].facts == expected
    # atexit after the non-daemon thread, as the interpreter orders them
    for run in runs.values():
        for rank in (0, 1):
            assert run.out.index(f"FACT thread rank {rank}") < run.out.index(f"FACT atexit rank {rank}")


ENDINGS = {  # how the script ends -> torchrun's exit code (each rank of a run ends its own way)
    "return,exit0,osexit0": 0, "exc": 1, "hook": 1, "exit3": 1, "exitstr": 1, "kbint": 1, "segv": 1,
}


@pytest.mark.parametrize("how", list(ENDINGS))
def test_every_ending_gives_torchruns_exit_code_and_output(tmp_path: Path, how: str) -> None:
    nproc = len(how.split(","))
    runs = {name: launch(name, tmp_path, "endings.py", how, nproc=nproc) for name in LAUNCHERS}
    assert runs["torchrun"].code == ENDINGS[how], runs["torchrun"].out[-3000:]
    for name in ("fork", "exec"):
        run = runs[name]
        assert run.code == ENDINGS[how], f"{name}:\n{run.out[-3000:]}"
        assert run.facts == runs["torchrun"].facts, f"{name}:\n{run.out[-3000:]}"
    if how in ("exc", "kbint"):
        for name, run in runs.items():  # the traceback on the console starts at the script, as python's
            first = run.out.index("Traceback (most recent call last):")
            frame = run.out[first:].splitlines()[1]
            assert "endings.py" in frame and "resctl" not in frame, f"{name}:\n{run.out[-3000:]}"


def test_children_of_every_start_method_find_the_scripts_functions(tmp_path: Path) -> None:
    runs = {name: launch(name, tmp_path, "children.py") for name in LAUNCHERS}
    for name, run in runs.items():
        assert run.code == 0, f"{name}:\n{run.out[-3000:]}"
        assert run.facts == runs["torchrun"].facts
    assert len(runs["torchrun"].facts) == 4


def _signalled(launcher: str, tmp_path: Path, how: str, signum: int) -> Run:
    cwd = tmp_path / f"{launcher}-{how}"
    cwd.mkdir()
    (cwd / "signals.py").write_text((SCRIPTS / "signals.py").read_text())
    proc = subprocess.Popen(command(launcher, "signals.py", [how], 2, cwd / "run"), cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    # Anywhere in the text: two workers printing at once can share a line.
    while len(re.findall(r"READY (\d+)", "".join(lines))) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    for pid in re.findall(r"READY (\d+)", "".join(lines)):
        os.kill(int(pid), signal.SIGUSR1)  # a handler the script set fires
    time.sleep(0.5)
    proc.send_signal(signum)  # to the launcher only, as a scheduler or a shell's `kill` would
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"{launcher}: did not stop:\n{''.join(lines) + out}") from None
    return Run(proc.returncode, "".join(lines) + out)


@pytest.mark.parametrize(("how", "signum", "resctl_code"), [("wait", signal.SIGINT, 130), ("term0", signal.SIGTERM, 143)],
                         ids=["sigint-keyboardinterrupt", "sigterm-workers-exit-0"])
def test_a_signalled_job_reaches_the_script_and_never_succeeds(tmp_path: Path, how: str, signum: int,
                                                               resctl_code: int) -> None:
    runs = {name: _signalled(name, tmp_path, how, signum) for name in LAUNCHERS}
    assert runs["torchrun"].code == 1, runs["torchrun"].out[-3000:]
    for name in ("fork", "exec"):
        run = runs[name]
        assert run.code == resctl_code, f"{name}:\n{run.out[-3000:]}"  # 128+N: intended (README)
        assert run.facts == runs["torchrun"].facts, f"{name}:\n{run.out[-3000:]}"
    assert len(runs["torchrun"].facts) == (4 if how == "wait" else 2)


def test_master_port_is_the_workers_as_under_torchrun(tmp_path: Path) -> None:
    """PyTorch's own launcher test: --master-port P and a process group made by tcp://localhost:P."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ["--master-addr", "localhost", "--master-port", str(port)]
    runs = {}
    for name in LAUNCHERS:
        cwd = tmp_path / name
        cwd.mkdir()
        (cwd / "init_method.py").write_text((SCRIPTS / "init_method.py").read_text())
        cmd = command(name, "init_method.py", [f"--init-method=tcp://localhost:{port}"], 2, cwd / "run")
        cmd[cmd.index("--nproc-per-node"):cmd.index("--nproc-per-node")] = flags
        proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=150)
        runs[name] = Run(proc.returncode, proc.stdout + proc.stderr)
    for name, run in runs.items():
        assert run.code == 0, f"{name}:\n{run.out[-3000:]}"
        assert run.facts == runs["torchrun"].facts
    assert runs["torchrun"].facts == [f"FACT rank {r} sum 2.0 master_port=True" for r in (0, 1)]
