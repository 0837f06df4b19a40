"""The generated completion scripts in a real bash: what TAB offers, as the README says to install them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASH = REPO / "completions" / "resctl.bash"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")


def tab(line: str, tmp_path: Path) -> list[str]:
    """What bash completes for the last word of `line` ("" when it ends in a space), through the
    function `complete -p resctl` names, as bash's readline would call it."""
    words = line.split() + ([""] if line.endswith(" ") else [])
    quoted = " ".join(f"'{w}'" for w in words)
    script = (f"source {BASH}\n"
              "fn=$(complete -p resctl | sed -n 's/.*-F \\([^ ]*\\) resctl$/\\1/p')\n"
              f"COMP_WORDS=({quoted}); COMP_CWORD={len(words) - 1}; COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}\n"
              '"$fn" resctl "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], cwd=tmp_path, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.splitlines() if w]


def test_installed_by_source_the_readme_way(tmp_path: Path) -> None:
    out = subprocess.run(["bash", "--norc", "-c", f"source {BASH}; complete -p resctl"], capture_output=True, text=True)
    assert out.stdout.strip() == "complete -o default -F _resctl resctl"
    assert "source completions/resctl.bash" in (REPO / "README.md").read_text()


def test_a_flag_is_offered_once_in_dashes(tmp_path: Path) -> None:
    assert tab("resctl run --nproc", tmp_path) == ["--nproc-per-node"]
    assert tab("resctl run --max", tmp_path) == ["--max-restarts"]
    assert not [w for w in tab("resctl run --", tmp_path) if "_" in w], "underscore aliases are hidden"


def test_values_come_from_the_flag_table(tmp_path: Path) -> None:
    assert tab("resctl run --start-method ", tmp_path) == ["fork", "spawn", "forkserver"]
    assert tab("resctl run --start_method f", tmp_path) == ["fork", "forkserver"]  # an alias typed still works
    assert tab("resctl run --rdzv-backend ", tmp_path) == ["c10d"]
    assert "storage" in tab("resctl doctor --only ", tmp_path)


def test_commands_subcommands_and_scripts(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    assert tab("resctl ", tmp_path)[:5] == ["doctor", "profile", "report", "run", "tune-interval"]
    assert tab("resctl profile ", tmp_path)[:3] == ["init", "show", "validate"]
    assert tab("resctl run --nproc-per-node 2 tr", tmp_path) == ["train.py"]


def test_the_aliases_are_still_accepted(tmp_path: Path) -> None:
    import sys

    (tmp_path / "train.py").write_text("")
    out = subprocess.run([sys.executable, "-m", "resctl", "run", "--nproc_per_node", "2", "--start_method", "spawn",
                          "--dry-run", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--nproc-per-node 2" in out.stdout and "--start-method spawn" in out.stdout
