"""One script that checks many things a new interpreter gives at once (tests/integration/parity/
facts.py: RNG streams per rank, the torchrun environment, __main__, logging, warnings, stdin, atexit
after non-daemon threads) under torchrun, `resctl run` (forked workers) and `resctl run` with exec'd
workers: the same exit codes and the same `FACT ...` lines.

Endings, child processes of every start method, signals and the master address/port are cases of
the compatibility suite (tests/compat/, one contract per script), which runs each under all three.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
        # Anywhere in a line, up to the next record: warnings prefix them, and two workers share a line when one
        # writes between another's text and its newline (every launcher here runs its workers `python -u`, so
        # print() writes them apart; CI saw "FACT spawn pool [1, 4, 9]RNG rank 1 ..." under resctl exec'd).
        return sorted(re.findall(r"FACT [^\n]*?(?=FACT |RNG rank |\n|$)", out))


def command(launcher: str, script: str, args: list[str], nproc: int, run_dir: Path) -> list[str]:
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), script, *args]
    start = [] if launcher == "fork" else ["--set", 'launch.worker_start="exec"']
    return [sys.executable, "-m", "resctl", "run", "--nproc-per-node", str(nproc), "--max-restarts", "0",
            "--run-dir", str(run_dir), *start, script, *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESCTL_", "TORCHELASTIC_"))}
    # The shell's choice, not the test's: the workers run `python -u` under every launcher here anyway (torchrun
    # adds it; so do resctl's), so a rank's print() writes its text and newline apart (`Run.facts` copes).
    env.pop("PYTHONUNBUFFERED", None)
    return {**env, "OMP_NUM_THREADS": "1"}


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
    for name in ("fork", "exec"):
        got = runs[name].facts
        assert got == expected, (f"{name} differs from torchrun:\n  only {name}: {sorted(set(got) - set(expected))}\n"
                                 f"  only torchrun: {sorted(set(expected) - set(got))}")
    # atexit after the non-daemon thread, as the interpreter orders them
    for run in runs.values():
        for rank in (0, 1):
            assert run.out.index(f"FACT thread rank {rank}") < run.out.index(f"FACT atexit rank {rank}")


def test_a_record_glued_to_another_ranks_is_cut_where_that_one_starts() -> None:
    """What CI saw under load: one rank's RNG line written between another's FACT text and its newline."""
    out = "FACT spawn pool [1, 4, 9]RNG rank 1 0.57 0.40 0.89\n\nwarn: FACT env x FACT main y\nFACT thread rank 0\n"
    assert Run(0, out).facts == ["FACT env x ", "FACT main y", "FACT spawn pool [1, 4, 9]", "FACT thread rank 0"]
