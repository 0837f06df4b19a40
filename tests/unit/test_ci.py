"""CI runs exactly the README's test commands (`.ci/run`), both passes, and fails on pytest's exit 5."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO


def _readme_test_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\*\*Test it\*\*.*?```bash\n(.*?)```", text, re.S)
    assert block, "README: the **Test it** block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readmes_test_commands_on_both_nvrx_versions() -> None:
    commands = _readme_test_commands()
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert len(commands) == 2 and all(c in ci for c in commands), (commands, ci)
    assert "--expect-nvrx 0.7.0" in commands[1] and '-m "slow or launcher"' in commands[1]
    fetch = (REPO / ".ci" / "nvrx07").read_text(encoding="utf-8")
    assert "pip\" download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_39_x86_64" in fetch


@pytest.mark.parametrize("pytest_code,ci_code", [(0, 0), (1, 1), (5, 1), (2, 1)])
def test_a_pass_that_collected_no_tests_fails_ci(pytest_code: int, ci_code: int) -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    verdict = re.search(r"^verdict\(\) \{.*?^\}$", ci, re.S | re.M)
    assert verdict and ci.count('verdict "pass') == 2
    done = subprocess.run(["bash", "-c", f"{verdict.group(0)}\nverdict 'pass 2' {pytest_code}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == ci_code, done.stderr
    assert ("no tests" in done.stderr) is (pytest_code == 5)
