"""A stop signal whose handler's exception is dropped is still seen (resctl.launch.signal_trace)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.integration.jobs import REPO

# The launcher's situation on NVRx 0.7.0: torch's handler raises SignalException; the signal lands as the
# parent's at-fork hook runs, where CPython prints and drops the exception.
SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from resctl.launch.signal_trace import SignalTrace

    class Stop(Exception):
        pass

    def handler(signum, frame):
        raise Stop(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGUSR1, handler)
    trace = SignalTrace.start()
    assert trace.fd >= 0
    assert trace.take({signal.SIGTERM}) is None, "nothing caught yet"
    os.register_at_fork(after_in_parent=lambda: os.kill(os.getpid(), signal.SIGTERM))
    try:
        pid = os.fork()
    except Stop:
        sys.exit("the exception was not dropped: the test does not reproduce the launcher's case")
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # another signal, not asked for
    except Stop:
        pass
    print("caught", trace.take({signal.SIGTERM}), "then", trace.take({signal.SIGTERM}))
""")


def test_a_stop_whose_exception_an_at_fork_hook_dropped_is_taken_from_the_trace() -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" in proc.stderr  # CPython dropped the handler's exception, as in the launcher
    assert proc.stdout.split() == ["caught", "15", "then", "None"], proc.stdout + proc.stderr


def test_a_wakeup_fd_someone_else_owns_is_left_to_them() -> None:
    script = textwrap.dedent("""
        import os, signal
        from resctl.launch.signal_trace import SignalTrace
        r, w = os.pipe(); os.set_blocking(w, False)
        signal.set_wakeup_fd(w)
        trace = SignalTrace.start()
        print(trace.fd, signal.set_wakeup_fd(-1) == w, trace.take({15}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["-1", "True", "None"], proc.stdout + proc.stderr
