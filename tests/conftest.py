"""Test isolation: no stray RESCTL_* or scheduler variables from the developer's shell, temp HOME.

Which NVRx the suite runs on: the one Python imports (the venv's 0.4.1, or 0.7.0 put first on PYTHONPATH:
`.ci/nvrx07`). `--expect-nvrx VERSION` stops the session when it is another (a wrong PYTHONPATH would run
0.4.1 twice); the `launcher` marker is every unit test of the launcher (CI's 0.7.0 pass runs
`-m "slow or launcher"`); `@pytest.mark.nvrx_series("0.4")` skips a test on the other series.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
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
    "test_leftovers.py",
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
    if not hasattr(config, "workerinput"):  # once, in the process that starts pytest's workers
        _byte_compile_the_launched_sources()
    # pytest keeps the test modules it rewrote (assertions) in __pycache__, but not where PYTHONDONTWRITEBYTECODE
    # is set (CI's and this machine's shells): each worker of each pass, and each pytest test_ci starts, then
    # rewrote all of them again (collection: 7.2 CPU-s against 3.4 with them kept). This process writes them;
    # the processes the tests start keep the environment's setting.
    sys.dont_write_bytecode = False
    expected = config.getoption("--expect-nvrx")
    if expected and installed_nvrx() != expected:
        raise pytest.UsageError(f"--expect-nvrx {expected}: Python imports NVRx {installed_nvrx()} "
                                "(put NVRx 0.7.0 first on PYTHONPATH: .ci/nvrx07 DIR; PYTHONPATH=DIR/src:DIR/deps)")


def _byte_compile_the_launched_sources() -> None:
    """Write the bytecode of resctl (an editable install: pip compiles none of it) and of the NVRx Python imports
    (CI's 0.7.0 is an unzipped wheel: none either) before any test starts a process. Where PYTHONDONTWRITEBYTECODE
    is set (CI's and this machine's shells), every launcher, worker and CLI the suite starts would otherwise compile
    them again from source: ~0.1 s a worker, ~0.3 s a launcher on 0.7.0, thousands of processes a run. A stale
    file is recompiled by Python itself (the timestamps are checked at import)."""
    import compileall

    import nvidia_resiliency_ext

    for root in (REPO / "resctl", *(Path(p) for p in nvidia_resiliency_ext.__path__)):
        if os.access(root, os.W_OK):
            compileall.compile_dir(root, quiet=2)


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
    _one_start_mode_per_test(config, items)
    _heaviest_files_first(items)
    for item in items:
        if item.path.name in LAUNCHER_UNIT_TESTS:
            item.add_marker(pytest.mark.launcher)
        wanted = item.get_closest_marker("nvrx_series")
        if wanted is not None and series not in wanted.args:
            item.add_marker(pytest.mark.skip(reason=f"NVRx {version} is series {series}; this test is for {wanted.args}"))


#: The heaviest test files, seconds of test time in pass 1 (`pytest --durations=0`, 2-core dev VM, 2026-12-05;
#: the compat suite's 1,145 s scaled to the two thirds of its launches left after ffb20f4's turns). xdist hands
#: out whole files in collection order (`--no-loadscope-reorder` in pyproject.toml; its default order is by number
#: of tests), so these start first, heaviest first, and the short files fill in behind them: a long file handed out
#: last ran alone at the end of a pass while the other workers idled (the engine's kill drill: 31 % of the CPU idle
#: in CI's last minutes).
HEAVY_FILES = {
    "compat/test_compat.py": 750, "integration/test_recovery.py": 424, "integration/test_data_position.py": 388,
    "integration/test_run.py": 273, "integration/test_fsdp_recovery.py": 190, "integration/test_stop_phases.py": 175,
    "unit/test_checkpoint_memory.py": 168, "integration/test_node_stop.py": 167, "integration/test_slurm_kit.py": 144,
    "integration/test_stop_step.py": 129, "integration/test_stragglers_sync.py": 120,
    "integration/test_hot_spare.py": 103, "integration/test_zero_edit_report.py": 97, "cli/test_cli.py": 93,
    "unit/test_checkpoint_replica.py": 86, "integration/test_quick_stop.py": 83, "unit/test_two_tier_run.py": 80,
    "unit/test_report_html.py": 66, "integration/test_external_store.py": 65, "cli/test_fuzz_events.py": 63,
    "integration/test_multihost.py": 62, "integration/test_cluster_preflight.py": 61,
    "integration/test_owned_rdzv.py": 59, "integration/test_checkpoint_kill.py": 57,
    "integration/test_memory_rollback.py": 56, "unit/test_data_position.py": 55,
}


def _heaviest_files_first(items: list[pytest.Item]) -> None:
    """HEAVY_FILES first, heaviest first; the other files after them in collection order; each file's tests in
    their own order."""
    tests = REPO / "tests"
    first_seen: dict[Path, int] = {}
    for i, item in enumerate(items):
        first_seen.setdefault(item.path, i)

    def weight(item: pytest.Item) -> tuple[int, int]:
        name = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return -HEAVY_FILES.get(name, 0), first_seen[item.path]

    items.sort(key=weight)


#: resctl's start modes, and the parameter names a test gives them (a test may also run torchrun beside them).
START_MODES, START_MODE_PARAMS = ("fork", "exec"), ("launcher", "worker_start", "start", "how")


def _start_mode(item: pytest.Item) -> tuple[str | None, tuple[object, ...]]:
    """(the resctl start mode the item runs under, the item less that mode), or (None, ()) for another item."""
    params = getattr(item, "callspec", None) and item.callspec.params  # type: ignore[attr-defined]
    for name in START_MODE_PARAMS:
        if params and params.get(name) in START_MODES:
            rest = tuple(sorted((key, repr(value)) for key, value in params.items() if key != name))
            return params[name], (str(item.path), item.originalname, rest)  # type: ignore[attr-defined]
    return None, ()


def _one_start_mode_per_test(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--start-modes fork-first|exec-first`: each test that runs under both resctl start modes (every compat
    case, each phase of the stop drill, each kill drill, ...) keeps one of them, fork and exec in turn in
    collection order from the given one, the compat cases and the other tests each in their own turn. CI's two
    passes take opposite turns: between them every such test meets both modes, each on one NVRx version. A
    torchrun run beside them, or a test under one mode only, stays."""
    first = {"fork-first": 0, "exec-first": 1}.get(config.getoption("--start-modes"))
    if first is None:
        return
    found = {item: _start_mode(item) for item in items}  # item -> (its mode, the item less its mode)
    modes: dict[tuple[object, ...], set[str]] = {}
    for mode, rest in found.values():
        if mode is not None:
            modes.setdefault(rest, set()).add(mode)
    keep: dict[tuple[object, ...], str] = {}
    counted = {True: 0, False: 0}  # compat tests, other tests
    for rest, present in modes.items():  # dicts keep collection order
        if len(present) > 1:
            compat = str(rest[0]).endswith("test_compat.py")
            keep[rest] = START_MODES[(first + counted[compat]) % 2]
            counted[compat] += 1

    dropped = [item for item, (mode, rest) in found.items() if rest in keep and mode != keep[rest]]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        gone = set(dropped)
        items[:] = [item for item in items if item not in gone]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--expect-nvrx", default=None, metavar="VERSION",
                     help="stop unless the NVRx Python imports is this version (CI's 0.7.0 pass)")
    parser.addoption("--launch-rendezvous", choices=("nvrx", "resctl"), default=None,
                     help="run every job with this launch.rendezvous (RESCTL_LAUNCH_RENDEZVOUS, set after the "
                          "isolation below): nvrx runs the multi-node tests against NVRx's own (the opt-out); "
                          "resctl's is the default (issues 25, 30)")
    parser.addoption("--compat-torchrun", default=None, metavar="FILE",
                     help="the compat suite's torchrun reference runs: read from FILE when an earlier pytest run of "
                          "the same compat cases, scripts and torch wrote it there, else launched and written to it "
                          "(CI: pass 1 writes, pass 2 reads: torchrun imports no NVRx; tests/compat/reference.py). "
                          "Give it as --compat-torchrun=FILE: pytest reads a separate FILE that exists as the path "
                          "to test, before this file's options are known")
    parser.addoption("--start-modes", choices=("both", "fork-first", "exec-first"), default="both",
                     help="resctl's start modes in the tests that run both (the compat cases, the stop and kill "
                          "drills, ...): both, or one per test, fork and exec in turn from the given one (CI's "
                          "passes: fork-first on NVRx 0.4.1, exec-first on 0.7.0; between them every such test "
                          "meets both modes)")


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With RESCTL_TEST_CPU=FILE, one JSON line a test: the CPU seconds its setup, call and teardown took in this
    process and in the processes it waited for (launchers and their workers), beside its wall time: where CI's CPU
    goes, which `--durations` (wall time, three workers sharing two cores) cannot say."""
    path = os.environ.get("RESCTL_TEST_CPU")
    if not path:
        yield
        return
    t0, own0, kids0 = time.monotonic(), _cpu_seconds(resource.RUSAGE_SELF), _cpu_seconds(resource.RUSAGE_CHILDREN)
    yield
    line = {"test": item.nodeid, "wall": round(time.monotonic() - t0, 2),
            "own": round(_cpu_seconds(resource.RUSAGE_SELF) - own0, 2),
            "children": round(_cpu_seconds(resource.RUSAGE_CHILDREN) - kids0, 2)}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def _cpu_seconds(who: int) -> float:
    """User and system CPU seconds of this process (RUSAGE_SELF) or of the children it waited for."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime
