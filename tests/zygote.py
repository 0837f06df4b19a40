"""Child scripts that start with torch already imported: `Zygote.popen([sys.executable, script, *args], ...)`
in place of `subprocess.Popen` for a test's own short-lived `python script.py` children (the checkpoint kill drills,
the two-rank sharded saves).

Each such child spent 2-3 CPU-s importing torch, torch.distributed and DCP before its first line of work (tests/
conftest.py's RESCTL_TEST_CPU: the sharded-save tests 96 CPU-s, the engine's kill drill 53, of CI's pass 1 on a 2-core
box). Here one process per test process (the zygote) imports them once and forks a child per run; the child is a
real process all the same: its own PID for the test's signals, its own stdin/stdout/stderr pipes, its environment,
argv and working directory as asked, the script run as `__main__` and the interpreter's own exit (atexit handlers,
non-daemon threads joined, the exit status of an uncaught exception or `sys.exit`). resctl itself is not preloaded:
each child imports it as a fresh interpreter would, with the environment the test gave it.

Not for what a test checks of an interpreter's start (the shim, the launchers): those start fresh processes.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

#: What the zygote imports before it forks: what the children import first and pay most for.
PRELOAD = ("torch", "torch.distributed", "torch.distributed.checkpoint", "torch.distributed.fsdp",
           "torch.distributed.tensor")

# The zygote: imports PRELOAD, then serves one request a connection: JSON {argv, env, cwd} with the child's stdin,
# stdout and stderr passed as file descriptors; answers the child's PID, later its exit status (returncode as
# subprocess gives it: negative for a signal). The child returns from serve() and runs the script at top level.
SERVER = r'''
import ctypes, importlib, json, os, runpy, signal, socket, sys, threading, warnings
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: gone with the test process, however it ends
if os.getppid() != int(sys.argv[3]):
    sys.exit(0)
warnings.filterwarnings("ignore")
for name in sys.argv[2].split(","):
    importlib.import_module(name)
warnings.resetwarnings()
import gc
gc.freeze()  # the children's collections skip what they were forked with (resctl's forked workers do the same)
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(16)
print("ready", flush=True)

def reap(conn, pid):
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    try:
        conn.sendall(f"exit {code}\n".encode())
    finally:
        conn.close()

def serve():
    while True:
        conn, _ = listener.accept()
        data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        request = json.loads(data)
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        conn.sendall(f"pid {pid}\n".encode())
        threading.Thread(target=reap, args=(conn, pid), daemon=True).start()

request, fds = serve()
for target, fd in zip((0, 1, 2), fds):
    os.dup2(fd, target)
    os.close(fd)
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a fresh interpreter has them (SIGPIPE ignored too)
os.environ.clear()
os.environ.update(request["env"])
os.chdir(request["cwd"])
script = request["argv"][1]
sys.argv = request["argv"][1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
del request, fds, listener, serve, reap
runpy.run_path(script, run_name="__main__")
'''


class Child:
    """The subset of `subprocess.Popen` the tests use, for a zygote's child."""

    def __init__(self, conn: socket.socket, pipes: dict[str, IO[Any] | None]) -> None:
        self._conn, self._said, self.returncode = conn, "", None
        self.stdin, self.stdout, self.stderr = pipes["stdin"], pipes["stdout"], pipes["stderr"]
        pid = self._line()
        if not pid.startswith("pid "):
            raise RuntimeError(f"the zygote refused the child: {pid!r}")
        self.pid = int(pid.split()[1])

    def _line(self) -> str:
        """The zygote's next line about this child ("pid N", then "exit CODE")."""
        while "\n" not in self._said:
            chunk = self._conn.recv(64).decode()
            if not chunk:
                raise RuntimeError("the zygote closed the connection without an answer")
            self._said += chunk
        line, self._said = self._said.split("\n", 1)
        return line

    def poll(self) -> int | None:
        if self.returncode is None:
            self._conn.setblocking(False)
            try:
                self._read_status()
            except BlockingIOError:
                pass
            finally:
                if self.returncode is None:
                    self._conn.setblocking(True)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                self._read_status()
            except TimeoutError:
                raise subprocess.TimeoutExpired(f"zygote child {self.pid}", timeout or 0.0) from None
            finally:
                if self.returncode is None:
                    self._conn.settimeout(None)
        assert self.returncode is not None
        return self.returncode

    def _read_status(self) -> None:
        self.returncode = int(self._line().split()[1])
        self._conn.close()

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        outs: dict[str, Any] = {}

        def read(name: str, stream: IO[Any]) -> None:
            outs[name] = stream.read()
            stream.close()

        if self.stdin is not None:
            self.stdin.close()
        readers = [threading.Thread(target=read, args=(name, s), daemon=True)
                   for name, s in (("out", self.stdout), ("err", self.stderr)) if s is not None]
        for r in readers:
            r.start()
        self.wait(timeout)
        for r in readers:
            r.join(timeout)
        return outs.get("out"), outs.get("err")

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """One per test process, started at its first use (`zygote()`), ended with the process."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="resctl-zygote-")
        self._path = os.path.join(self._dir, "sock")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        argv = [sys.executable, "-c", SERVER, self._path, ",".join(PRELOAD), str(os.getpid())]
        self._proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        assert self._proc.stdout is not None
        ready = self._proc.stdout.readline()
        if ready.strip() != "ready":
            raise RuntimeError(f"the zygote did not start (exit {self._proc.poll()})")
        atexit.register(self.close)

    def popen(self, args: list[str], *, env: dict[str, str] | None = None, cwd: str | Path | None = None,
              stdin: int | None = None, stdout: int | None = None, stderr: int | None = None,
              text: bool = False) -> Child:
        """`subprocess.Popen(args, ...)` for `args = [sys.executable, script, *script_args]`; stdin, stdout and
        stderr: None (this process's), subprocess.PIPE, subprocess.DEVNULL, or stderr=subprocess.STDOUT."""
        assert args[0] == sys.executable, args
        ends: list[int] = []
        pipes: dict[str, IO[Any] | None] = {}
        for name, how in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
            fd, mine = _child_end(name, how, ends)
            ends.append(fd)
            mode = ("w" if name == "stdin" else "r") + ("" if text else "b")
            pipes[name] = None if mine is None else os.fdopen(mine, mode, **({"encoding": "utf-8", "errors": "replace"}
                                                                             if text else {}))
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(self._path)
        request = {"argv": list(map(str, args)), "env": dict(os.environ if env is None else env),
                   "cwd": str(cwd or os.getcwd())}
        socket.send_fds(conn, [json.dumps(request).encode()], ends)
        for fd in set(ends) - {0, 1, 2}:  # the child's ends of its pipes and /dev/null: its own now
            os.close(fd)
        return Child(conn, pipes)

    def run(self, args: list[str], *, timeout: float | None = None, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run(args, capture_output=True, ...)`."""
        child = self.popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
        try:
            out, err = child.communicate(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise
        return subprocess.CompletedProcess(args, child.wait(), out, err)

    def close(self) -> None:
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        Path(self._path).unlink(missing_ok=True)
        Path(self._dir).rmdir()


def _child_end(name: str, how: int | None, ends: list[int]) -> tuple[int, int | None]:
    """The descriptor the child gets for `name`, and this process's end of its pipe (None: no pipe)."""
    if how == subprocess.PIPE:
        r, w = os.pipe()
        return (r, w) if name == "stdin" else (w, r)
    if how == subprocess.DEVNULL:
        return os.open(os.devnull, os.O_RDWR), None
    if how == subprocess.STDOUT:
        assert name == "stderr"
        return ends[1], None
    return {"stdin": 0, "stdout": 1, "stderr": 2}[name], None


_ZYGOTE: Zygote | None = None
_LOCK = threading.Lock()


def zygote() -> Zygote:
    """This process's zygote (started at the first call)."""
    global _ZYGOTE
    with _LOCK:
        if _ZYGOTE is None:
            _ZYGOTE = Zygote()
        return _ZYGOTE
