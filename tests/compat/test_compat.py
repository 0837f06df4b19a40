"""Drop-in compatibility: every script in tests/compat/scripts/ under torchrun, `resctl run` (forked
workers) and `resctl run --set launch.worker_start=exec`, 2 workers on CPU, compared line by line
and fact by fact with torchrun's run (tests/compat/runner.py says how).

CI compares each case under one start mode a pass, the passes in opposite turns (`--start-modes`:
tests/conftest.py); pass 2 takes torchrun's runs from pass 1 (`--compat-torchrun`: tests/compat/reference.py). All selected cases are launched once, up front, RESCTL_COMPAT_JOBS (default 3)
launches at a time; each test then compares. A known difference is xfail(strict) from tests/compat/expected.py: when it
is fixed the test XPASSes and fails the run until its entry is removed.

    .venv/bin/python -m pytest tests/compat -q                      # the whole suite (slow)
    .venv/bin/python -m pytest tests/compat -q -k "end_sys_exit"    # some cases (only those launch)
    .venv/bin/python -m tests.compat.table > docs/compat.md        # the table of cases x launchers
    RESCTL_COMPAT_SAVE=/tmp/compat.json .venv/bin/python -m pytest tests/compat   # keep what each launch showed
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.compat import reference
from tests.compat.cases import CASES, FRAMEWORK_KILL_AT, FRAMEWORKS, Case
from tests.compat.expected import EXPECTED
from tests.compat.runner import SCRIPTS, Outcome, compare, launch, parse, run_all, save, split_launcher

JOBS = int(os.environ.get("RESCTL_COMPAT_JOBS", "3"))


def _params() -> list[Any]:
    """Each case under each resctl start mode (`--start-modes fork-first|exec-first` keeps one of them per case:
    tests/conftest.py)."""
    params = []
    for name in CASES:
        for launcher in ("fork", "exec"):
            reason = EXPECTED.get(name, {}).get(launcher)
            marks = [pytest.mark.xfail(strict=not reason.startswith("sometimes"), reason=reason)] if reason else []
            params.append(pytest.param(name, launcher, marks=marks, id=f"{name}-{launcher}"))
    return params


@pytest.fixture(scope="module")
def outcomes(request: pytest.FixtureRequest) -> dict[str, dict[str, Outcome]]:
    """Launch only the cases this session selected."""
    mine = [item.callspec.params for item in request.session.items
            if item.module is request.module and hasattr(item, "callspec")]
    wanted: dict[str, set[str]] = collections.defaultdict(lambda: {"torchrun"})  # case -> its launchers
    for params in mine:
        if "case" in params:
            wanted[params["case"]].add(params.get("launcher", "torchrun"))
    kills = {(params["framework"], params["launcher"]) for params in mine if "framework" in params}
    for framework, _ in kills:
        wanted[framework].add("torchrun")  # a killed run's reference: the uninterrupted run under torchrun
    shared = request.config.getoption("--compat-torchrun")
    known = reference.read(Path(shared), CASES) if shared else {}
    for name in wanted:
        if name in known:
            wanted[name].discard(reference.TORCHRUN)
    t0 = time.monotonic()
    results = run_all([CASES[n] for n in CASES if n in wanted and wanted[n]], JOBS, only=wanted)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, JOBS)) as pool:
        futures = {pool.submit(launch, kill_case(f), la): (f, la) for f, la in sorted(kills)}
        for future, (f, la) in futures.items():
            results.setdefault(kill_case(f).name, {})[la] = future.result()
    launched = {n: by[reference.TORCHRUN] for n, by in results.items() if reference.TORCHRUN in by}
    for name, out in known.items():
        if name in wanted:
            results.setdefault(name, {})[reference.TORCHRUN] = out
    if shared and launched:
        reference.write(Path(shared), {**known, **launched})
    if os.environ.get("RESCTL_COMPAT_SAVE"):
        save(results, Path(os.environ["RESCTL_COMPAT_SAVE"]), time.monotonic() - t0)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_torchrun_does_what_the_case_says(case: str, outcomes: dict[str, dict[str, Outcome]]) -> None:
    """The reference itself: torchrun ends the script with the declared code and prints its facts."""
    c, ref = CASES[case], outcomes[case]["torchrun"]
    assert not ref.hang, f"torchrun hung ({ref.hang}):\n" + "\n".join(ref.raw[-40:])
    crash = [line for line in ref.raw if any(w in line for w in ("terminate called", "Abort", "Fatal Python", "what()"))]
    assert ref.code == c.code, "\n".join(crash + ref.raw[-40:])
    assert len(ref.facts) >= c.facts and set(ref.ranked) >= ({0, 1} if c.facts else set()), ref.raw[-40:]


@pytest.mark.slow
@pytest.mark.parametrize("case,launcher", _params())
def test_same_as_torchrun(case: str, launcher: str, outcomes: dict[str, dict[str, Outcome]]) -> None:
    ref, got = outcomes[case]["torchrun"], outcomes[case][launcher]
    diffs = compare(CASES[case], ref, got)
    assert not diffs, "\n".join(diffs) + "\n--- console:\n" + "\n".join(got.raw[-60:])


def kill_case(name: str) -> Case:
    """The framework's case with rank 1 SIGKILLed at FRAMEWORK_KILL_AT on the first attempt (one restart allowed)."""
    return dataclasses.replace(CASES[name], name=f"{name}_kill", args=(*CASES[name].args, str(FRAMEWORK_KILL_AT)),
                               max_restarts=1)


def _checksums(out: Outcome) -> set[str]:
    return {v.split("checksum=")[1] for (_, k), vs in out.facts.items() if k == "steps" for v in vs}


# Where the framework's own resume is not exact: its loader starts the interrupted epoch over (Lightning
# warns "resuming from a checkpoint that ended before the epoch ended"), so the weights differ from the
# uninterrupted run's (docs/frameworks.md).
RESTARTS_EPOCH = {"fw_lightning", "fw_fabric"}


# Each framework under both start modes; `--start-modes fork-first|exec-first` keeps one a pass (tests/conftest.py),
# the two CI passes in opposite turns, so each pass kills four (each launch takes ~20 s of CI's two cores) and
# between them every framework is killed under both.
KILLED_UNDER = [(f, la) for f in FRAMEWORKS for la in ("fork", "exec")]


@pytest.mark.slow
@pytest.mark.parametrize("framework,launcher", KILLED_UNDER)
def test_a_framework_survives_a_sigkill_from_its_own_checkpoint(framework: str, launcher: str,
                                                                 outcomes: dict[str, dict[str, Outcome]]) -> None:
    """Rank 1 SIGKILLed at step 15: exit 0, both ranks resumed from the step-10 checkpoint the framework
    wrote, the report counts its checkpoints (10, 20, 30) and the rollback 15->10; exact resume where the
    framework's loader allows it (the final weights of the uninterrupted torchrun run)."""
    got = outcomes[f"{framework}_kill"][launcher]
    console = "\n--- console:\n" + "\n".join(got.raw[-60:])
    assert got.code == 0 and not got.hang, console
    resumed = {(rank, v) for (rank, k), vs in got.facts.items() if k == "attempt" for v in vs}
    assert resumed >= {(0, "1 start_step=10"), (1, "1 start_step=10")}, console
    assert got.report.get("checkpoints") == 3 and got.report.get("final_step") == 30, (got.report, console)
    assert got.report.get("rollbacks") == [(FRAMEWORK_KILL_AT, 10)], (got.report, console)
    reference = _checksums(outcomes[framework]["torchrun"])
    assert len(reference) == 1 and len(_checksums(got)) == 1, console
    if framework not in RESTARTS_EPOCH:
        assert _checksums(got) == reference, console


def test_every_script_is_a_case_and_every_expected_entry_names_one() -> None:
    scripts = {p.name for p in SCRIPTS.iterdir() if p.suffix in (".py", ".sh")}
    named = {c.script for c in CASES.values() if not c.module}
    assert scripts == named, (scripts - named, named - scripts)
    assert len(CASES) >= 50
    for name, launchers in EXPECTED.items():
        assert name in CASES and set(launchers) <= {"fork", "exec"} and all(launchers.values()), name


def test_a_record_glued_to_a_warning_line_is_kept() -> None:
    """Workers write through (torchrun's `python -u`, resctl's forked workers alike): a rank's record can land
    between another rank's warning text and its newline. The warning is noise; the record is the script's."""
    raw = ["/x/torch/cuda/__init__.py:64: FutureWarning: The pynvml package is deprecated.",
           "  import pynvml  # type: ignore[import]OUT rank=0 0000 xx", "OUT rank=1 0000 xx"]
    out = Outcome("torchrun", 0, 0.0, raw)
    parse(out)
    assert out.ranked == {0: ["OUT rank=0 0000 xx"], 1: ["OUT rank=1 0000 xx"]}
    assert not out.unranked


@pytest.mark.xfail(reason="console_sample.txt predates issue 20's fix that puts a forked worker's traceback on "
                          "the console; the sample and its expected split need redoing", strict=False)
def test_console_split_keeps_the_scripts_lines_and_drops_the_launchers() -> None:
    """torchrun's logging and ChildFailedError traceback, resctl's `resctl:` lines and their indented
    summary block, the pynvml warning: the launcher's; the script's traceback (frames outside the
    scripts dropped) and records that two workers wrote onto one line: the script's."""
    raw = (Path(__file__).parent / "console_sample.txt").read_text().splitlines()
    out = Outcome("torchrun", 1, 0.0, raw)
    parse(out)
    assert out.ranked == {0: ["OUT rank=0 a", "FACT rank=0 k"], 1: ["OUT rank=1 b", "ValueError: boom rank=1"]}
    assert out.facts == {(0, "k"): ["v"]}
    assert out.unranked == collections.Counter({
        "Traceback (most recent call last):": 1,
        f'  File "{SCRIPTS}/end_exception.py", line 15, in <module>': 1,
        '    raise ValueError(f"boom rank={RANK}")': 1,
    })
    _, own = split_launcher(raw)
    assert any(line.startswith("torch.distributed.elastic") for line in own)
    assert any(line.startswith("resctl: ") for line in own) and "    4 x exception: boom" in own


def test_compare_names_a_hang_an_exit_code_and_volatile_facts_by_property() -> None:
    case = Case("x", 0)
    ref = Outcome("torchrun", 0, 0.0, ["FACT rank=0 ~seed=1", "FACT rank=1 ~seed=2", "FACT rank=0 a=1"])
    same = Outcome("fork", 0, 0.0, ["FACT rank=0 ~seed=3", "FACT rank=1 ~seed=4", "FACT rank=0 a=1"])
    shared = Outcome("fork", 3, 0.0, ["FACT rank=0 ~seed=5", "FACT rank=1 ~seed=5", "FACT rank=0 a=2"])
    hung = Outcome("exec", None, 0.0, [], hang="no exit in 60 s")
    for out in (ref, same, shared, hung):
        parse(out)
    assert compare(case, ref, same) == []
    diffs = compare(case, ref, shared)
    assert diffs[0] == "exit code 3 (torchrun 0)"
    assert "fact ~seed distinct across ranks: False (torchrun True)" in diffs
    assert "fact rank=0 a=2 (torchrun 1)" in diffs
    assert compare(case, ref, hung) == ["hang (no exit in 60 s)"]


def test_the_resource_trackers_leaked_semaphore_warning_is_the_interpreters_noise() -> None:
    """Python's resource tracker warns when it looks before a spawn DataLoader's finalizers ran (timing, any
    launcher): not a line of the script's, nor a difference from torchrun."""
    raw = ["/usr/lib/python3.11/multiprocessing/resource_tracker.py:224: UserWarning: resource_tracker: There appear "
           "to be 1 leaked semaphore objects to clean up at shutdown",
           "  warnings.warn('resource_tracker: There appear to be %d '", "FACT rank=0 total=140",
           "/usr/lib/python3.11/multiprocessing/resource_tracker.py:267: UserWarning: resource_tracker: "
           "'/mp-hqtzoxe3': [Errno 2] No such file or directory",
           "  warnings.warn('resource_tracker: %r: %s' % (name, e))"]
    script, own = split_launcher(raw)
    assert script == ["FACT rank=0 total=140"] and own == []


def test_a_record_that_met_a_warning_or_a_resctl_line_on_one_line_stays_the_scripts() -> None:
    """Unbuffered workers write a record's text and its newline apart (`python -u`, as torchrun's): another process's
    line can land between them. CI lost "OUT rank=0 0096" to the pynvml warning another process of the job wrote
    there (ci13); a `resctl:` line printed the same way (text, then newline) can take a record after its text."""
    warning = ("/work/x/.venv/lib/python3.11/site-packages/torch/cuda/__init__.py:64: FutureWarning: The pynvml "
               "package is deprecated. Please install nvidia-ml-py instead.")
    raw = ["OUT rank=0 0095 xx", "OUT rank=0 0096 xx" + warning, "", "  import pynvml  # type: ignore[import]",
           "resctl: note: the job goes onOUT rank=1 0007 yy", "OUT rank=0 0097 xx",
           "/usr/lib/python3.11/multiprocessing/resource_tracker.py:224: UserWarning: resource_tracker: There appear to "
           "be 1 leaked semaphore objects to clean up at shutdownOUT rank=1 0008 yy"]
    script, own = split_launcher(raw)
    assert script == ["OUT rank=0 0095 xx", "OUT rank=0 0096 xx", "", "OUT rank=1 0007 yy", "OUT rank=0 0097 xx",
                      "OUT rank=1 0008 yy"]
    assert own == ["resctl: note: the job goes on"]
    # a warning alone (no record before it) keeps nothing of its line
    assert split_launcher([warning, "  import pynvml  # type: ignore[import]"]) == ([], [])


def test_torchrun_runs_are_shared_only_with_a_later_run_of_the_same_tree(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--compat-torchrun`: what pass 1 wrote, pass 2 reads; a run that did not do what its case says, or a file
    made from other scripts, cases or torch, is launched again."""
    (good, c1), (bad, c2) = list(CASES.items())[:2]
    shell = next(name for name, c in CASES.items() if c.shell_env)
    runs = {good: Outcome("torchrun", c1.code, 1.0, ["FACT rank=0 seen=1", "FACT rank=1 seen=1"]),
            bad: Outcome("torchrun", (c2.code or 0) + 1, 1.0, []), shell: Outcome("torchrun", CASES[shell].code, 1.0, [])}
    path = tmp_path / "torchrun.json"
    reference.write(path, runs)
    got = reference.read(path, CASES)
    assert set(got) == {good} and got[good].facts == {(0, "seen"): ["1"], (1, "seen"): ["1"]}, "env_names: each pass's own"
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "a.py").write_text("print('a')\n")
    monkeypatch.setattr(reference, "SCRIPTS", scripts)
    before = reference.fingerprint()
    (scripts / "a.py").write_text("print('b')\n")
    assert reference.fingerprint() != before, "a changed script is another tree"
    assert reference.read(path, CASES) == {}, "a file of another tree is not read"
    path.write_text("{not json")
    assert reference.read(path, CASES) == {}
