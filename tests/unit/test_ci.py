"""CI runs exactly the README's test commands (`.ci/run`), both passes, and fails on pytest's exit 5."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

PASS_2 = "(slow or launcher) and not nvrx_independent"


def _readme_test_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"\*\*Test it\*\*.*?```bash\n(.*?)```", text, re.S)
    assert block, "README: the **Test it** block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_ci_runs_the_readmes_test_commands_on_both_nvrx_versions() -> None:
    commands = _readme_test_commands()
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert len(commands) == 2 and all(c in ci for c in commands), (commands, ci)
    assert "--expect-nvrx 0.7.0" in commands[1] and f'-m "{PASS_2}"' in commands[1]
    assert "--start-modes exec-first" in commands[1]
    assert commands[0].endswith("-m pytest --start-modes fork-first --compat-torchrun=.compat-torchrun.json")
    # pass 1 launches every torchrun reference afresh and leaves them for pass 2 (tests/compat/reference.py)
    assert "rm -f .compat-torchrun.json && " in commands[0] and commands[1].endswith("--compat-torchrun=.compat-torchrun.json")
    fetch = (REPO / ".ci" / "nvrx07").read_text(encoding="utf-8")
    assert "pip[@]}\" download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_39_x86_64" in fetch


@pytest.mark.parametrize("pytest_code,ci_code", [(0, 0), (1, 1), (5, 1), (2, 1)])
def test_a_pass_that_collected_no_tests_fails_ci(pytest_code: int, ci_code: int) -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    verdict = re.search(r"^verdict\(\) \{.*?^\}$", ci, re.S | re.M)
    assert verdict and ci.count('verdict "pass') == 2
    done = subprocess.run(["bash", "-c", f"{verdict.group(0)}\nverdict 'pass 2' {pytest_code}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == ci_code, done.stderr
    assert ("no tests" in done.stderr) is (pytest_code == 5)


#: A test that runs under both start modes, in a collected id: a compat case's comparison or a stop-drill phase.
TWO_MODE = re.compile(r"(test_same_as_torchrun|test_stop_phases\.py::\w+)\[(\w+)-(fork|exec)\]")


def _collected(*options: str) -> list[str]:
    """The test ids `pytest --collect-only OPTIONS` selects."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider",
                          *options], cwd=REPO, capture_output=True, text=True, timeout=300)
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    assert out.returncode == 0 and ids, out.stdout[-2000:] + out.stderr[-2000:]
    return ids


@pytest.fixture(scope="module")
def pass_2(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What CI's second pass collects (one collection for the two tests below), with pass 1's torchrun runs in
    place and named as the README names them: `--compat-torchrun FILE` with FILE present made pytest take FILE for
    the path to test, load no tests/conftest.py and stop on its options (CI, exit 4)."""
    made = tmp_path_factory.mktemp("ci") / "torchrun.json"
    made.write_text("{}")
    given = re.search(r"--compat-torchrun[= ]\S+", _readme_test_commands()[1])
    assert given, "the README's pass 2 reads pass 1's torchrun runs"
    form = given.group(0).split(".compat-torchrun.json")[0]
    return _collected("-m", PASS_2, "--start-modes", "exec-first", *(form + str(made)).split(" "))


def test_the_second_pass_keeps_every_launcher_test_and_one_start_mode_of_each_test(pass_2: list[str]) -> None:
    """What the 0.7.0 pass selects: every launcher unit test file and every job test but those marked
    nvrx_independent; each compat case once (under fork or exec) beside its torchrun reference, each phase of
    the stop drill once, and both modes over the tests that run both in pass 1."""
    from tests.compat.cases import CASES
    from tests.conftest import LAUNCHER_UNIT_TESTS
    from tests.integration.test_stop_phases import PHASES

    ids = pass_2
    files = {i.split("::")[0].rsplit("/", 1)[-1] for i in ids}
    assert LAUNCHER_UNIT_TESTS <= files, LAUNCHER_UNIT_TESTS - files
    assert {"test_recovery.py", "test_node_stop.py", "test_hot_spare.py", "test_stop_phases.py"} <= files
    assert not files & {"test_data_position.py", "test_checkpoint_kill.py", "test_memory_rollback.py"}
    two_mode = [m.groups() for m in map(TWO_MODE.search, ids) if m]
    compared = [(name, mode) for test, name, mode in two_mode if test == "test_same_as_torchrun"]
    assert sorted(name for name, _ in compared) == sorted(CASES), "each case once"
    assert {mode for _, mode in compared} == {"fork", "exec"}
    assert sorted(name for test, name, _ in two_mode if test != "test_same_as_torchrun") == sorted(PHASES), \
        "each phase once"
    modes = [m.group(1) for m in (re.search(r"\[(?:\w+-)?(fork|exec)\]$", i) for i in ids if "compat" not in i) if m]
    assert abs(modes.count("fork") - modes.count("exec")) <= 2, modes


def test_the_two_passes_run_each_test_under_opposite_start_modes(pass_2: list[str]) -> None:
    """CI's pass 1 (fork-first) and pass 2 (exec-first): each compat case and stop-drill phase under one mode a
    pass, and between them under both."""
    from tests.compat.cases import CASES
    from tests.integration.test_stop_phases import PHASES

    def compared(ids: list[str]) -> set[tuple[str, str]]:
        return {(m.group(2), m.group(3)) for m in map(TWO_MODE.search, ids) if m}

    # The whole suite, as CI collects it: which mode a test gets depends on the two-mode tests collected before it.
    first = compared(_collected("--start-modes", "fork-first"))
    second = compared(pass_2)
    everything = {(name, mode) for name in (*CASES, *PHASES) for mode in ("fork", "exec")}
    assert len(first) == len(second) == len(everything) // 2 and not first & second
    assert first | second == everything


def test_each_heavy_file_named_for_the_schedule_exists() -> None:
    """A renamed or removed file would silently lose its place at the front of the workers' queue."""
    from tests.conftest import HEAVY_FILES

    assert [name for name in HEAVY_FILES if not (REPO / "tests" / name).is_file()] == []
    assert list(HEAVY_FILES.values()) == sorted(HEAVY_FILES.values(), reverse=True)
