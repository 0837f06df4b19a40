"""resctl.launch.standby: a warm interpreter per local rank that a restarted exec'd worker starts in (issue 43).

Real standby processes: started with a worker's command and environment, handed another, they become it (the
same PID); a command or environment a standby cannot take is exec'd afresh or refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resctl.launch import standby
from resctl.launch.standby import Standbys

pytestmark = pytest.mark.launcher
PY = sys.executable
#: The worker the tests hand over: it writes what it sees (argv, PID, env, which modules were there before it ran)
PROBE = """\
import gc, json, os, sys
out = os.environ["PROBE_OUT"]
imported = sys.modules.get("collector_at_import")
json.dump({"pid": os.getpid(), "argv": sys.argv, "orig_argv": sys.orig_argv, "rank": os.environ.get("RANK"),
           "extra": os.environ.get("EXTRA"), "gone": "GONE" in os.environ, "name": __name__,
           "preimported": "decimal" in sys.modules, "set": os.environ.get("SET_AT_IMPORT"),
           "collector_at_import": getattr(imported, "ENABLED", None), "collector": gc.isenabled(),
           "frozen": gc.get_freeze_count()}, open(out, "w"))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def probe(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    (tmp_path / "standby_probe.py").write_text(PROBE)
    (tmp_path / "sets_env.py").write_text("import os\nos.environ.setdefault('SET_AT_IMPORT', 'cache')\n")
    (tmp_path / "collector_at_import.py").write_text("import gc\nENABLED = gc.isenabled()\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PROBE_OUT": str(tmp_path / "out.json"), "RANK": "0", "GONE": "1"}
    return tmp_path / "out.json", env


def _seen(out: Path, process: subprocess.Popen[bytes]) -> dict:
    assert process.wait(60) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize(("args", "want"), [
    ([PY, "-u", "-m", "resctl.shim", "train.py", "--lr", "3"], ([PY, "-u"], "resctl.shim", ["train.py", "--lr", "3"])),
    ([PY, "-m", "pkg.mod"], ([PY], "pkg.mod", [])),
    ([PY, "-X", "dev", "-m", "m", "-m"], None),  # an option's value is not an option: not read as one
    ([PY, "-u", "train.py"], None),  # a script path (--no-python's, --run-path's): not `python -m`
    ([PY, "-c", "print(1)", "-m", "x"], None),
    ([PY, "-m"], None),
    (["/other/python", "-m", "x"], None),
    (["numactl", "--cpunodebind=0", PY, "-m", "x"], None),
])
def test_only_python_dash_m_of_this_interpreter_is_taken(args: list[str], want: object) -> None:
    assert standby.python_command(args) == want


@pytest.mark.parametrize(("setting", "cores", "workers", "want"), [
    ("on", 1, 8, True), ("off", 64, 1, False), ("auto", 16, 1, True), ("auto", 3, 1, False), ("auto", 4, 1, True),
    ("auto", 18, 8, True), ("auto", 17, 8, False), ("auto", 192, 8, True), ("bogus", 2, 1, False),
])
def test_auto_keeps_standbys_where_cores_are_spare(setting: str, cores: int, workers: int, want: bool) -> None:
    assert standby.choose(setting, cores, workers) is want


@pytest.mark.parametrize(("name", "early"), [
    ("RANK", False), ("LOCAL_WORLD_SIZE", False), ("TORCHELASTIC_RESTART_COUNT", False), ("MASTER_PORT", False),
    ("FT_RANK_MONITOR_IPC_SOCKET", False), ("NCCL_DEBUG", False), ("RESCTL_STORE_PREFIX", False),
    ("OMP_NUM_THREADS", True), ("PYTHONHASHSEED", True), ("CUDA_VISIBLE_DEVICES", True), ("RANKS", True),
    ("LD_PRELOAD", True),
])
def test_what_a_standby_may_take_late_and_what_it_must_start_afresh_for(name: str, early: bool) -> None:
    assert standby.early_read(name) is early


def test_a_standby_becomes_the_worker_it_is_handed(probe: tuple[Path, dict[str, str]]) -> None:
    out, env = probe
    args = [PY, "-u", "-m", "standby_probe", "--x", "1"]
    ready = standby.start(args, env, ("decimal",))
    assert ready is not None
    handed = {k: v for k, v in env.items() if k != "GONE"} | {"RANK": "1"}  # late names: taken as they come
    time.sleep(0.5)
    assert ready.hand_over(args, handed)
    seen = _seen(out, ready.process)
    assert seen["pid"] == ready.process.pid and seen["name"] == "__main__"
    assert seen["rank"] == "1" and seen["gone"] is False  # GONE went, and it is not late: ...
    assert seen["orig_argv"] == args and seen["preimported"] is False  # ... so it started afresh, with the args


def test_late_differences_run_in_the_warm_interpreter(probe: tuple[Path, dict[str, str]]) -> None:
    out, env = probe
    args = [PY, "-u", "-m", "standby_probe", "--x", "1"]
    ready = standby.start(args, env, ("decimal", "sets_env", "collector_at_import"))  # sets_env sets a variable, as
    assert ready is not None  # inductor's import does
    assert ready.hand_over(args, env | {"RANK": "3", "TORCHELASTIC_RESTART_COUNT": "2"})
    seen = _seen(out, ready.process)
    assert seen["pid"] == ready.process.pid and seen["rank"] == "3" and seen["preimported"] is True
    # the standby imported with the collector off (preload.collector_off); the worker has it on and nothing
    # frozen, as a fresh interpreter
    assert (seen["collector_at_import"], seen["collector"], seen["frozen"]) == (False, True, 0)
    assert seen["set"] == "cache"  # what its imports set is what a fresh worker importing them would have
    assert seen["argv"][1:] == ["--x", "1"] and seen["argv"][0].endswith("standby_probe.py")  # as `python -m` sets it
    assert "resctl.launch.standby" in seen["orig_argv"]  # the one trace of the standby (the shim sets a title)


def test_the_worker_exit_status_is_the_processs(probe: tuple[Path, dict[str, str]]) -> None:
    out, env = probe
    args = [PY, "-u", "-m", "standby_probe"]
    ready = standby.start(args, env, ())
    assert ready is not None and ready.hand_over(args, env | {"PROBE_EXIT": "0", "RANK": "2"})
    assert ready.process.wait(60) == 0
    ready = standby.start(args, env | {"PROBE_EXIT": "7"}, ())
    assert ready is not None and ready.hand_over(args, env | {"PROBE_EXIT": "7"})
    assert ready.process.wait(60) == 7


def test_a_standby_whose_pipe_closes_without_a_command_exits_at_once(probe: tuple[Path, dict[str, str]]) -> None:
    _, env = probe
    ready = standby.start([PY, "-m", "standby_probe"], env, ("torch",))
    assert ready is not None
    ready.close_pipe()  # the launcher let it go (or died): it need not finish importing torch
    assert ready.process.wait(30) == 0


def _marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from resctl.launch import stop

    marker = tmp_path / "stop" / "marker"
    marker.parent.mkdir(mode=0o700)
    monkeypatch.setenv(stop.ENV, str(marker))
    return marker


def test_take_refuses_another_interpreter_and_records_what_it_saw(tmp_path: Path, probe: tuple[Path, dict[str, str]],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from resctl.launch import stop

    out, env = probe
    stop.mark_stepped({stop.ENV: str(_marker(tmp_path, monkeypatch))})
    monkeypatch.setattr(Standbys, "seen", {})
    monkeypatch.setattr(Standbys, "ready", {})
    args = [PY, "-u", "-m", "standby_probe"]
    assert Standbys.take(0, args, env) is None and Standbys.seen[0] == (args, env)  # none ready: the usual start
    ready = standby.start(args, env, ())
    assert ready is not None
    Standbys.ready[0] = ready
    assert Standbys.take(0, [PY, "-m", "standby_probe"], env) is None  # without -u: not this standby's
    assert ready.process.poll() is not None and 0 not in Standbys.ready  # discarded, reaped
    Standbys.ready[1] = ready = standby.start(args, env, ())  # type: ignore[assignment]
    assert Standbys.take(1, args, env | {"RANK": "1"}) is ready.process
    assert _seen(out, ready.process)["rank"] == "1"


def test_a_standby_per_rank_after_each_start_taken_only_once_a_worker_stepped(
        tmp_path: Path, probe: tuple[Path, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> None:
    from resctl.launch import stop

    out, env = probe
    marker = _marker(tmp_path, monkeypatch)
    monkeypatch.setattr(Standbys, "wanted", True)
    monkeypatch.setattr(Standbys, "seen", {})
    monkeypatch.setattr(Standbys, "ready", {})
    args = [PY, "-u", "-m", "standby_probe"]
    assert Standbys.take(0, args, env) is None and Standbys.take(1, [PY, "x.py"], env) is None
    Standbys.workers_started()
    first = Standbys.ready[0]
    assert list(Standbys.ready) == [0]  # rank 1 is not `python -m`: none for it
    Standbys.workers_started()
    assert Standbys.ready == {0: first}  # one a rank
    assert Standbys.take(0, args, env) is None  # no worker stepped yet: let go, started afresh
    assert first.process.wait(30) is not None
    Standbys.workers_started()
    stop.mark_stepped({stop.ENV: str(marker)})
    second = Standbys.ready[0]
    assert Standbys.take(0, args, env | {"RANK": "5"}) is second.process
    assert _seen(out, second.process)["rank"] == "5"
    Standbys.workers_started()
    Standbys.close()
    assert Standbys.ready == {}


@given(st.lists(st.text(min_size=1, max_size=6), max_size=6))
def test_a_command_taken_apart_is_the_command(args: list[str]) -> None:
    for command in ([PY, *args], [PY, *args[:2], "-m", *args[2:]]):
        parts = standby.python_command(command)
        if parts is not None:  # only a `python [-options] -m MODULE ...` of this interpreter, given back whole
            interpreter, module, rest = parts
            assert [*interpreter, "-m", module, *rest] == command
            assert all(o.startswith("-") and o not in ("-c", "-m") for o in interpreter[1:])
