"""What resctl prints is true: help pages, doctor's table on a narrow terminal, --dry-run's headings,
`profile validate` in one pass, where tune-interval's mode comes from."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

COMMANDS = ([], ["run"], ["doctor"], ["report"], ["tune-interval"], ["profile"], ["profile", "show"],
            ["profile", "init"], ["profile", "validate"])


def resctl(*args: str, cwd: Path, columns: int = 200, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resctl", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": str(columns), **(env or {})}, timeout=60)


@pytest.mark.parametrize("columns", [80, 100])
def test_help_pages_show_whole_summaries_and_no_python_types(tmp_path: Path, columns: int) -> None:
    for command in COMMANDS:
        page = resctl(*command, "--help", cwd=tmp_path, columns=columns).stdout
        assert not re.search(r"<(str|int|float|path|list\[str\]|bool)>", page), (command, page)
        commands = page.partition("Commands:")[2].partition("Example")[0]
        assert "..." not in commands, (command, commands)  # click cuts a summary that does not fit with "..."
    run = resctl("run", "--help", cwd=tmp_path).stdout
    assert "--set KEY=VALUE" in run and "--nnodes NNODES" in run and "{SCRIPT} [SCRIPT_ARGS]..." in run


def test_doctor_on_a_100_column_terminal_keeps_names_whole_and_units(tmp_path: Path) -> None:
    env = {"NCCL_NVLS_ENABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}
    out = resctl("doctor", "--only", "env,shm", "--set", "inprocess.enabled=true", cwd=tmp_path, columns=100,
                 env=env).stderr
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, out
    cells = [line.split("│") for line in lines if line.startswith("│")]
    detail = [c[-2].strip() for c in cells if len(c) > 2]
    assert any("TORCH_NCCL_ASYNC_ERROR_HANDLING=0:" in d for d in detail), out  # on one line, not cut
    assert any("NCCL_NVLS_ENABLE=1" in d for d in detail), out
    shm = next(c for c in cells if c[1].strip() == "shm.size")
    assert re.fullmatch(r"\d+(\.\d+)? GB", shm[4].strip()), shm  # "expected 1.0 GB", not "1.0"
    assert "…" not in out


def test_dry_run_says_it_wrote_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    out = resctl("run", "--run-dir", str(tmp_path / "run"), "--dry-run", "train.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "files written before launch" not in out.stdout
    assert "# what a run creates before launch (a dry run creates nothing)" in out.stdout
    assert f"{tmp_path / 'run'}/" in out.stdout and str(tmp_path / "run" / "plan.json") in out.stdout
    assert not (tmp_path / "run").exists()


def test_profile_validate_reports_field_and_cross_field_problems_together(tmp_path: Path) -> None:
    (tmp_path / "p.toml").write_text('[launch]\nterm_timeout = "10s"\nnnodes = "zero"\n'
                                     '[checkpoint]\nsigterm_grace = "30s"\n'
                                     '[inprocess]\nenabled = true\nsoft_timeout = "100s"\nhard_timeout = "50s"\n')
    out = resctl("profile", "validate", "p.toml", cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "3 problems" in out.stderr, out.stderr
    assert "p.toml -> launch.nnodes" in out.stderr  # a field error
    assert "p.toml -> inprocess: soft_timeout < hard_timeout" in out.stderr  # a rule across keys
    assert "p.toml -> checkpoint.sigterm_grace" in out.stderr  # and the grace rule, in the same pass


def test_tune_interval_says_where_the_mode_came_from() -> None:
    from resctl.telemetry.goodput import Calibration
    from resctl.tuning.inputs import Inputs, assemble

    run = Calibration(step_time=0.1, step_time_p50=0.1, step_samples=100, stall=0.01, waited=0.0, write=1.0,
                      write_bytes=1e6, saves=5, interval_steps=10, async_=True, restart=2.0, unplanned_faults=0,
                      wall_s=60.0, async_source="plan.json")
    engine = assemble(Inputs(mtbf_per_node=3600.0), run)
    assert engine.mode == "async" and engine.sources["mode"] == "run (plan.json: checkpoint.async)"
    own = assemble(Inputs(mtbf_per_node=3600.0), replace(run, async_=False, async_source="torch.save"))
    assert own.mode == "sync" and "the script's own torch.save blocks" in own.sources["mode"]


def test_no_wheel_or_large_binary_is_committed() -> None:
    repo = Path(__file__).resolve().parents[2]
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = [f for f in listed.stdout.split("\0") if f]
    assert not [f for f in files if f.endswith(".whl")], "wheels stay out of git (.gitignore: /.whl/, /.whl07/)"
    big = [f for f in files if (repo / f).is_file() and (repo / f).stat().st_size > 512 * 1024]
    assert not big, big


def test_only_run_help_loads_the_schema_for_its_defaults(tmp_path: Path) -> None:
    """`resctl run --help` reads each flag's default from the schema; `resctl --help` stays light."""
    code = ("import runpy, sys; sys.argv = ['resctl', '--help']\ntry:\n runpy.run_module('resctl', run_name='__main__')\n"
            "except SystemExit: pass\nprint('SCHEMA' if 'resctl.profile.schema' in sys.modules else 'LIGHT', file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.stderr.strip().endswith("LIGHT"), out.stderr[-500:]
