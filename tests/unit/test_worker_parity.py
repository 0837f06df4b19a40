"""The pieces that make a worker end and start as a new interpreter would (issue 20); the same
scripts under torchrun and resctl are compared in tests/integration/test_torchrun_parity.py."""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import warnings
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from resctl.launch import agent, preload
from resctl.patching import Patches
from resctl.shim import ending, forked
from resctl.shim.signals import SigtermWatcher


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (256, 0), (-1, 255), (True, 1), ("bye", 1)])
def test_exit_status_is_the_interpreters(code: object, status: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert ending.exit_status(code) == status
    assert capsys.readouterr().err == ("bye\n" if code == "bye" else "")


def test_the_script_is_main_and_its_traceback_starts_at_its_frame(tmp_path: Any, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: Any) -> None:
    from resctl.shim.target import Target, run_target

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setitem(sys.modules, "__main__", sys.modules["__main__"])
    script = tmp_path / "train.py"
    script.write_text("import builtins, sys\nseen = (__name__, __spec__, __package__, __builtins__ is builtins, "
                      "sys.argv, type(__loader__).__name__)\ndef step():\n    raise ValueError('boom')\nstep()\n")
    ended = ending.run(functools.partial(run_target, Target(str(script), ["--lr", "1"], False)))
    assert ended.code == 1 and isinstance(ended.error, ValueError) and not ended.by_sigint
    err = capsys.readouterr().err
    assert err.splitlines()[1].startswith(f'  File "{script}", line 5') and err.rstrip().endswith("ValueError: boom")
    main = sys.modules["__main__"]
    assert main.__file__ == str(script) and sys.path[0] == str(tmp_path)
    assert main.seen == ("__main__", None, None, True, [str(script), "--lr", "1"], "SourceFileLoader")


def test_a_scripts_excepthook_and_keyboardinterrupt(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    seen: list[str] = []
    monkeypatch.setattr(sys, "excepthook", lambda t, v, tb: seen.append(t.__name__))

    def interrupted() -> None:
        raise KeyboardInterrupt

    ended = ending.run(interrupted)
    assert seen == ["KeyboardInterrupt"] and ended.by_sigint and not ended.clean
    assert ending.run(lambda: sys.exit("x")).code == 1 and ending.run(lambda: None).clean


def _in_child(body: Callable[[], int]) -> int:
    """Run `body` in a forked child; its return value is the child's exit status."""
    pid = os.fork()
    if pid == 0:
        try:
            code = body()
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            code = 99
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_forked_worker_gets_a_new_interpreters_state(tmp_path: Any) -> None:
    launcher_file = tmp_path / "launcher-atexit"

    def child() -> int:
        atexit.register(launcher_file.write_text, "ran")  # the launcher's: must not run in a worker
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        logging.captureWarnings(True)
        signal.signal(signal.SIGHUP, lambda *_: None)
        signal.signal(signal.SIGINT, lambda *_: None)
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
        forked.reset()
        checks = [
            not logging.getLogger().handlers and logging.getLogger().level == logging.WARNING,
            warnings.showwarning is warnings._showwarning_orig,  # type: ignore[attr-defined]
            signal.getsignal(signal.SIGHUP) == signal.SIG_DFL,
            signal.getsignal(signal.SIGINT) is signal.default_int_handler,
            not signal.pthread_sigmask(signal.SIG_BLOCK, []),
            sys.excepthook is sys.__excepthook__,
            mp.current_process().name == "MainProcess" and mp.parent_process() is None,
        ]
        atexit._run_exitfuncs()
        checks.append(not launcher_file.exists())
        return sum(1 << i for i, ok in enumerate(checks) if not ok)

    assert _in_child(child) == 0


def test_exit_handlers_registered_while_importing_are_recorded(monkeypatch: Any) -> None:
    monkeypatch.setattr(preload.ExitHandlers, "recorded", [])
    calls: list[str] = []
    other = threading.Thread(target=lambda: None)
    with preload.ExitHandlers.recording():
        atexit.register(calls.append, "import")
        other.start()  # a registration from another thread is not an import's
        other.join()
    atexit.unregister(calls.append)
    funcs = [f for f, _, _ in preload.ExitHandlers.at_import()]
    assert calls.append in [f for f, _, _ in preload.ExitHandlers.recorded] and calls.append in funcs
    assert logging.shutdown in funcs and atexit.register is not None


def test_the_launcher_takes_a_worker_that_exited_0_without_a_result_for_done() -> None:
    ctx = mp.get_context("fork")
    queues = {0: ctx.SimpleQueue(), 1: ctx.SimpleQueue()}
    queues[1].put("value")
    fake = SimpleNamespace(
        _pc=SimpleNamespace(processes=[SimpleNamespace(exitcode=0, join=lambda: None),
                                       SimpleNamespace(exitcode=0, join=lambda: None)]),
        _ret_vals=queues, _return_values={}, _worker_finished_event=ctx.Event(), nprocs=2)
    fake._is_done = lambda: len(fake._return_values) == fake.nprocs
    agent.settle_exited(fake)
    assert fake._return_values == {0: None, 1: "value"} and fake._worker_finished_event.is_set()
    running = SimpleNamespace(**{**vars(fake), "_return_values": {}, "_worker_finished_event": ctx.Event()})
    running._pc = SimpleNamespace(processes=[SimpleNamespace(exitcode=None, join=lambda: None)] * 2)
    running._is_done = lambda: len(running._return_values) == 2
    agent.settle_exited(running)
    assert running._return_values == {} and not running._worker_finished_event.is_set()


def test_a_child_forked_by_the_worker_does_not_stop_the_worker_on_sigterm() -> None:
    fired: list[str] = []
    patches = Patches("test")
    SigtermWatcher(lambda: fired.append("restart"), lambda: fired.append("job")).install(patches)
    try:
        pid = os.fork()
        if pid == 0:
            time.sleep(10)
            os._exit(0)
        time.sleep(0.3)  # the child's at-fork hook has run
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
        time.sleep(0.2)
        assert os.waitstatus_to_exitcode(status) == -signal.SIGTERM and fired == []
    finally:
        patches.undo()


# A fresh interpreter: its first at-fork hook (before the watcher's) holds the child in the moment between
# fork() and the watcher's hook, where a SIGTERM used to run the shim's handler in the child and land in
# the worker's pipe (Pool.terminate() of a pool whose worker had not run yet stopped the worker: exit 143).
_SIGTERM_AT_FORK = r"""
import os, signal, sys, time
from resctl.patching import Patches
from resctl.shim.signals import SigtermWatcher

os.register_at_fork(after_in_child=lambda: time.sleep(0.5))
fired = []
patches = Patches("test")
SigtermWatcher(lambda: fired.append("restart"), lambda: fired.append("job")).install(patches)
pid = os.fork()
if pid == 0:
    time.sleep(3)
    os._exit(0)
os.kill(pid, signal.SIGTERM)  # at once: the child is still in its at-fork hooks
_, status = os.waitpid(pid, 0)
time.sleep(0.3)  # a write into the worker's pipe would have reached its watcher by now
blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
print(os.waitstatus_to_exitcode(status), fired, blocked)
"""


def test_a_sigterm_right_after_fork_ends_the_child_and_never_reaches_the_worker() -> None:
    import subprocess

    out = subprocess.run([sys.executable, "-c", _SIGTERM_AT_FORK], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # The child died of SIGTERM as a fresh interpreter's child does; the worker saw nothing; its mask is back.
    assert out.stdout.split("\n")[0] == f"{-signal.SIGTERM} [] False", out.stdout + out.stderr


# Forks of one interpreter, as forked workers are of the launcher: the first two before numpy.random is
# imported (a first cycle's workers), the last two after (restarted workers: the launcher imported it).
_FORKED_DRAWS = r"""
import os, random, sys
import torch
from resctl.shim import forked

assert "numpy.random" not in sys.modules  # torch imports numpy, not numpy.random

def fork_and_draw():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        forked.reset()
        import numpy.random
        os.write(w, repr((random.random(), float(numpy.random.rand()), torch.rand(1).item())).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        return f.read()

draws = [fork_and_draw(), fork_and_draw()]
import numpy.random
draws += [fork_and_draw(), fork_and_draw()]
draws.append(repr((random.random(), float(numpy.random.rand()), torch.rand(1).item())))  # the "launcher's" own
print("\n".join(draws))
"""


@pytest.mark.slow
def test_every_forked_worker_draws_its_own_random_numbers_whether_numpy_random_was_loaded_or_not() -> None:
    import ast
    import subprocess

    out = subprocess.run([sys.executable, "-c", _FORKED_DRAWS], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    draws = [ast.literal_eval(line) for line in out.stdout.splitlines()]
    assert len(draws) == 5
    for stream in range(3):  # Python's random, NumPy's global generator, torch's CPU generator
        values = [d[stream] for d in draws]
        assert len(set(values)) == len(values), (stream, values)
