"""The store host's rendezvous store in a process of its own, forked while the launcher has one thread.

torch's TCPStore server (both its libuv and its older daemon) names every client it accepts with
`getnameinfo`, a reverse lookup that holds glibc's resolver lock for a moment, in the server's own
thread. A process forked from the launcher while that thread holds the lock inherits it held, with no
thread to release it: its first name lookup (a forked worker's `init_process_group` connecting to the
store) waits forever, and the worker never reaches a step, so no heartbeat timeout sees it. A worker is
forked while its own peers, forked a moment earlier, connect to that store: CI hung so once in ~50
restarts of a 4-rank drill (all four ranks in gloo's rendezvous, the last one in `__resolv_context_get`;
tests/unit/test_store_keeper.py). torchrun's workers are exec'd (no lock crosses an exec), and so
are resctl's `exec` workers; the launcher's own forks (rank monitors) are children of the same process.

So on the node that hosts the store (`is_host`, which the plan sets for one node), the launcher forks a
*keeper* before it starts any thread (`serve_apart`, called where the rendezvous backend is made): the
keeper serves torch's TCPStore and nothing else; the launcher, NVRx's backend and the workers connect
to it as clients, exactly as the other nodes do. It lives as long as the launcher: a pipe's end it
waits on closes when the launcher exits however it exits, a SIGKILL to the launcher kills it too
(PDEATHSIG), and the launcher's exit stops and reaps it (`stop`), after the store host waited for the
other nodes. Where anything fails (the port taken, no fork), nothing is changed: NVRx hosts the store in
the launcher as before, with its own error or fallback.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from resctl.launch import lifeline
from resctl.launch.exits import readable, sleep_until_exit
from resctl.launch.titles import set_title

log = logging.getLogger(__name__)

#: How long the launcher waits for the keeper's port; longer (a stuck child), the launcher hosts the store.
READY_TIMEOUT = 30.0
#: How long the launcher's exit waits for the keeper to leave before it SIGKILLs it.
STOP_TIMEOUT = 2.0


@dataclass
class Keeper:
    """A running keeper: its pid, the launcher's end of its life pipe, and the store's port."""

    pid: int
    life_fd: int
    port: int

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Close the life pipe (the keeper exits) and reap it; SIGKILL after `timeout`."""
        if self.life_fd >= 0:
            os.close(self.life_fd)
            self.life_fd = -1
        if not _reaped(self.pid, timeout):
            _kill(self.pid)
            _reaped(self.pid, timeout)


def serve_apart(params: Any, use_libuv: bool) -> tuple[Any, Keeper] | None:
    """For a launcher told to host the store (`is_host` true): fork the keeper, and return a copy of
    `params` that makes this launcher a client of it, with the keeper; None to host it as NVRx does."""
    if params.get_as_bool("is_host", None) is not True:
        return None  # another node's store, or NVRx's own guess by host name
    others = other_threads()
    if others:  # a fork now could copy a lock held by one: the launcher hosts it
        log.info("resctl: the launcher hosts the rendezvous store itself (threads running: %s)", ", ".join(others))
        return None
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import DEFAULT_PORT
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=DEFAULT_PORT)  # as create_backend reads it
    timeout = int(params.get_as_int("read_timeout", 60) or 60)
    keeper = start(host, port, timeout, use_libuv)
    if keeper is None:
        return None
    atexit.register(keeper.stop)
    client = copy.copy(params)
    client.config = {**params.config, "is_host": "0"}
    client.endpoint = f"[{host}]:{keeper.port}" if ":" in host else f"{host}:{keeper.port}"
    log.info("resctl: the rendezvous store (%s) is served by process %s, forked from the launcher before its "
             "threads (resctl.launch.store_keeper)", client.endpoint, keeper.pid)
    return client, keeper


def other_threads() -> list[str]:
    """The names of the threads running beside this one (a fork is safe only with none)."""
    me = threading.current_thread()
    return [t.name for t in threading.enumerate() if t is not me]


def start(host: str, port: int, timeout: int, use_libuv: bool) -> Keeper | None:
    """Fork the keeper and wait for its store to listen; None when it could not (it is reaped)."""
    ready_r, ready_w = os.pipe()
    life_r, life_w = os.pipe()
    group = os.getpgrp()
    try:
        pid = os.fork()
    except OSError as err:
        for fd in (ready_r, ready_w, life_r, life_w):
            os.close(fd)
        log.warning("resctl: no keeper process for the rendezvous store (%s); the launcher hosts it", err)
        return None
    if pid == 0:  # pragma: no cover - the child; tests/unit/test_store_keeper.py runs it
        os.close(ready_r)
        os.close(life_w)
        _keep(host, port, timeout, use_libuv, ready_w, life_r, group)
    os.close(ready_w)
    os.close(life_r)
    answer = _read_line(ready_r, READY_TIMEOUT)
    os.close(ready_r)
    if answer.isdigit():
        return Keeper(pid, life_w, int(answer))
    os.close(life_w)
    if not _reaped(pid, STOP_TIMEOUT):
        _kill(pid)
        _reaped(pid, STOP_TIMEOUT)
    log.warning("resctl: the rendezvous store's keeper did not start (%s); the launcher hosts it",
                answer or "no answer")
    return None


def _keep(host: str, port: int, timeout: int, use_libuv: bool, ready_fd: int, life_fd: int, group: int) -> None:
    """The keeper: serve the store until the launcher is gone, then leave without the interpreter's teardown.
    It stays in the launcher's process group (the fork hook gave it one of its own, as a worker's): a SIGKILL of
    the group, a node's loss as the tests make it, takes the store with the launcher, as a thread of it was."""
    code = 0
    try:
        with contextlib.suppress(OSError):
            os.setpgid(0, group)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a job stop is the launcher's to make: the store serves it
        lifeline.die_with_parent(signal.SIGKILL)
        _close_inherited({ready_fd, life_fd})
        set_title("resctl-store")
        import torch.distributed as dist

        store = dist.TCPStore(host, port, None, True, timeout=timedelta(seconds=timeout), wait_for_workers=False,
                              use_libuv=use_libuv)
        os.write(ready_fd, f"{store.port}\n".encode())
        os.close(ready_fd)
        while os.read(life_fd, 1):  # EOF: the launcher closed its end, or exited
            pass
    except BaseException as err:  # noqa: BLE001 - said to the launcher, which hosts the store itself then
        code = 1
        try:
            os.write(ready_fd, f"{type(err).__name__}: {err}\n".encode())
        except OSError:
            pass
    os._exit(code)


def _close_inherited(keep: set[int]) -> None:
    """Every descriptor of the launcher's but stdio and `keep` (its log, its sockets, the pipes of `resctl
    run` it inherited: the keeper must hold none of them open)."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass


def _read_line(fd: int, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not readable([fd], left):
            break
        chunk = os.read(fd, 512)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").strip()


def _reaped(pid: int, timeout: float) -> bool:
    """`pid` (a child) exited within `timeout` and is reaped."""
    sleep_until_exit([pid], [], timeout)
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:
        return True


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
