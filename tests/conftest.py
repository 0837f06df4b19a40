"""Test isolation: no stray RESCTL_* or scheduler variables from the developer's shell, temp HOME.

Which NVRx the suite runs on: the one Python imports (the venv's 0.4.1, or 0.7.0 put first on PYTHONPATH:
`.ci/nvrx07`). `--expect-nvrx VERSION` stops the session when it is another (a wrong PYTHONPATH would run
0.4.1 twice); the `launcher` marker is every unit test of the launcher (CI's 0.7.0 pass runs
`-m "slow or launcher"`); `@pytest.mark.nvrx_series("0.4")` skips a test on the other series.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCHEDULER_VARS = ("SLURM_", "JOB_COMPLETION_INDEX", "PET_", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                  "LOCAL_RANK", "TORCHELASTIC_", "FT_", "KUBERNETES_", "POD_NAMESPACE", "GROUP_RANK")


#: The launcher's unit tests (files), marked `launcher`: CI's NVRx 0.7.0 pass runs them with the slow tests.
LAUNCHER_UNIT_TESTS = {
    "test_ft_entry.py", "test_patching.py", "test_wake_on_exit.py", "test_worker_parity.py", "test_nvrx_private.py",
    "test_nvrx_flags.py", "test_plan.py", "test_stop_marker.py", "test_spares.py", "test_owned_rdzv.py",
    "test_rdzv_rounds.py", "test_console_lines.py", "test_rendezvous.py", "test_shim_recovery.py", "test_agent_groups.py",
}


def installed_nvrx() -> str:
    try:
        return metadata.version("nvidia-resiliency-ext")
    except metadata.PackageNotFoundError:
        return "none"


def pytest_report_header(config: pytest.Config) -> str:
    import nvidia_resiliency_ext

    # 0.4.1 ships no __init__.py (a namespace package: no __file__); its __path__ says where it is either way
    return f"NVRx {installed_nvrx()} from {', '.join(nvidia_resiliency_ext.__path__)}"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "launcher: a unit test of the launcher (CI runs it on every NVRx version)")
    config.addinivalue_line("markers", "nvrx_series(series): runs only on that ft_launcher series (\"0.4\", \"0.6+\")")
    config.addinivalue_line("markers", "nvrx_independent: a slow test whose subject is resctl's own code, the same on "
                            "every NVRx (checkpoint storage, the memory tier's rollback, the data position); the "
                            "restarts it goes through are tested on both. CI's 0.7.0 pass leaves it out")
    # Tests start launchers and scripts from other working directories: a relative PYTHONPATH entry would
    # name nothing there, and those processes would silently run the venv's NVRx instead.
    if os.environ.get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            os.path.abspath(entry) if entry else entry for entry in os.environ["PYTHONPATH"].split(os.pathsep))
    expected = config.getoption("--expect-nvrx")
    if expected and installed_nvrx() != expected:
        raise pytest.UsageError(f"--expect-nvrx {expected}: Python imports NVRx {installed_nvrx()} "
                                "(put NVRx 0.7.0 first on PYTHONPATH: .ci/nvrx07 DIR; PYTHONPATH=DIR/src:DIR/deps)")


#: The end of each failure's report, printed again as the session's last words (after pytest's short summary,
#: whose XFAIL lines pushed it into the cut middle once): a CI log that keeps only its head and tail still
#: shows why each test failed.
DIGEST_LINES, DIGEST_CHARS = 14, 3000


@pytest.hookimpl(wrapper=True, tryfirst=True)  # around pytest's own summary: printed after its short summary
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> Iterator[None]:
    yield
    failed = [*terminalreporter.stats.get("failed", []), *terminalreporter.stats.get("error", [])]
    if not failed:
        return
    budget = DIGEST_CHARS // len(failed)
    terminalreporter.section("the end of each failure (the whole report is above)")
    for report in failed:
        tail = "\n".join(line[:240] for line in report.longreprtext.splitlines()[-DIGEST_LINES:])
        terminalreporter.write_line(f"{report.nodeid} ({report.when})\n{tail[-budget:]}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from resctl.profile.nvrx_versions import series_for

    version = installed_nvrx()
    series = series_for(version) if version != "none" else ""
    if config.getoption("--compat-launchers") == "alternate":
        _one_mode_per_compat_case(config, items)
    for item in items:
        if item.path.name in LAUNCHER_UNIT_TESTS:
            item.add_marker(pytest.mark.launcher)
        wanted = item.get_closest_marker("nvrx_series")
        if wanted is not None and series not in wanted.args:
            item.add_marker(pytest.mark.skip(reason=f"NVRx {version} is series {series}; this test is for {wanted.args}"))


def _one_mode_per_compat_case(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect each compat case's comparison under the start mode it does not get (tests.compat.cases)."""
    from tests.compat.cases import alternate_mode

    def other_mode(item: pytest.Item) -> bool:
        params = getattr(item, "callspec", None) and item.callspec.params  # type: ignore[attr-defined]
        return bool(params) and item.path.name == "test_compat.py" and "case" in params and \
            params.get("launcher") not in (None, alternate_mode(params["case"]))

    dropped = [item for item in items if other_mode(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not other_mode(item)]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--expect-nvrx", default=None, metavar="VERSION",
                     help="stop unless the NVRx Python imports is this version (CI's 0.7.0 pass)")
    parser.addoption("--launch-rendezvous", choices=("nvrx", "resctl"), default=None,
                     help="run every job with this launch.rendezvous (RESCTL_LAUNCH_RENDEZVOUS, set after the "
                          "isolation below): nvrx runs the multi-node tests against NVRx's own (the opt-out); "
                          "resctl's is the default (issues 25, 30)")
    parser.addoption("--compat-launchers", choices=("both", "alternate"), default="both",
                     help="the compat suite's resctl start modes: both for every case, or one per case, fork and "
                          "exec in turn (CI's NVRx 0.7.0 pass: the 0.4.1 pass compares both)")


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    for name in list(os.environ):
        if name.startswith("RESCTL_") or name.startswith(SCHEDULER_VARS):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    rendezvous = request.config.getoption("--launch-rendezvous")
    if rendezvous:
        monkeypatch.setenv("RESCTL_LAUNCH_RENDEZVOUS", rendezvous)


@pytest.fixture
def resctl_cmd() -> list[str]:
    return [sys.executable, "-m", "resctl"]
