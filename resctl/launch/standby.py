"""A warm standby interpreter per local rank, for exec'd workers (`launch.worker_start = "exec"`; issue 43).

A restarted exec'd worker is a new interpreter that imports torch (and what its script imports with it) before its
first step: on an H100, a kill whose survivor was blocked in a CUDA kernel cost 3.5 s with exec'd workers against
0.86 s with forked ones, whose new processes import nothing.
Forked workers skip that (the launcher imported torch for them, `resctl.launch.preload`); exec'd ones cannot. So
the launcher keeps one interpreter per local rank started in advance: `python [-u] -m resctl.launch.standby`,
with the environment its rank's worker had, that imports what the workers import and then waits for a command
line on a pipe. At the next worker start (a restart), the handler torch elastic builds for that rank
(`SubprocessHandler`, reached through resctl's subclass: `install`) hands the worker's command line and
environment to the standby instead of starting a process; the standby becomes the worker: `python -m resctl.shim
...` run in it (`become`), with the worker's PID being the standby's. A new standby is started for the next one.

What a standby worker differs in, beside a fresh one: torch (and the rest of `imports`) is in `sys.modules`
before the script runs, as in a forked worker; what importing it warned is shown again at hand-over, through the
worker's filters; `ps` shows `resctl-standby local=N` until the shim sets the worker's title, and
`sys.orig_argv` names this module. Nothing else:
it is a new interpreter, started with the worker's own interpreter options and environment. A worker whose
environment differs from the standby's in a variable read before the hand-over (anything but resctl's own,
torch elastic's per-round and per-rank values, NCCL_*, ...) makes the standby exec that command afresh (its PID
kept): what a fresh worker would have been, at the old cost; so does a command that is not `python -m`.

When: a standby per local rank is started right after each worker start (the agent's `after_start`), beside the
workers; it imports what forked workers get from the launcher and what a script imports at its first optimizer
(`preload.PRELOAD`, `preload.LATE_PRELOAD`; its time and memory: bench/standby_cost.py, docs/BENCHMARKS.md). A worker starts in it only once
a worker of this launcher has made a step (`stop.mark_stepped`): its script imports torch, as a fresh interpreter
would then; before that (a crash at import, a script that never imports torch) the standby is let go and the worker
starts afresh, as under torchrun. `launch.standby`: auto = where the node has `preload.SPARE_CORES` cores to spare
beyond two per local worker (its own and its standby's import); on; off. What it costs: one idle interpreter per
local rank with torch imported (host memory, no CUDA context: no GPU memory), and its import's
CPU once per worker start, beside the training.
"""

from __future__ import annotations

import importlib
import logging
import os
import runpy
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from resctl.launch import lifeline, preload, prestart, stop
from resctl.launch.titles import set_title
from resctl.patching import Patches
from resctl.profile import contract

MODULE = "resctl.launch.standby"
#: Variables of a worker's environment read only after the hand-over: torch elastic's per-rank and per-round
#: values and NVRx's sockets (exact names), beside the launcher's late ones (`prestart.late_read`).
WORKER_LATE = frozenset({"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                         "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "FT_LAUNCHER_IPC_SOCKET", "FT_RANK_MONITOR_IPC_SOCKET"})
#: Handler modules torch elastic's process contexts build their handlers through (`get_subprocess_handler`): torch's
#: (NVRx 0.6+) and the copy NVRx 0.4/0.5 ship.
HANDLER_MODULES = ("torch.distributed.elastic.multiprocessing.api",
                   "nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.multiprocessing.api")
#: What a standby imports: what every worker imports (what the launcher preloads for forked ones) and what a script
#: imports at its first optimizer (the late preload's modules), as the late preload's at-once mode does.
IMPORTS = preload.PRELOAD + preload.LATE_PRELOAD


def choose(setting: str, cores: int, workers: int) -> bool:
    """`launch.standby` resolved for a node with `cores` usable CPUs and `workers` local workers."""
    if setting in ("on", "off"):
        return setting == "on"
    return cores - 2 * workers >= preload.SPARE_CORES  # a core for each worker and one for its standby's import


def python_command(args: Sequence[str]) -> tuple[list[str], str, list[str]] | None:
    """`python [options] -m MODULE ARGS...` -> ([python, options...], MODULE, ARGS); None for any other command."""
    if not args or args[0] != sys.executable or "-m" not in args[1:]:
        return None
    at = list(args).index("-m", 1)
    options = list(args[1:at])
    if at + 1 >= len(args) or any(not o.startswith("-") or o in ("-c", "-m") for o in options):
        return None
    return [args[0], *options], args[at + 1], list(args[at + 2:])


@dataclass
class Standby:
    """One waiting interpreter: its process, the pipe its command line goes on, what it was started as."""

    process: subprocess.Popen[bytes]
    write_fd: int
    interpreter: list[str]  # [python, options...]

    def hand_over(self, args: Sequence[str], env: Mapping[str, str]) -> bool:
        try:
            if self.process.poll() is not None:
                return False
            fd, self.write_fd = self.write_fd, -1
            prestart.send(fd, args, env)
            return True
        except OSError:
            return False
        finally:
            self.close_pipe()

    def close_pipe(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1

    def discard(self) -> None:
        """Kill it and reap it (its session: it imports, it has no children)."""
        self.close_pipe()
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            pass


class Standbys:
    """The launcher's standbys, one per local rank (class state: one launcher per process)."""

    wanted: bool | None = None  # resolved at the first worker start
    seen: dict[int, tuple[list[str], dict[str, str]]] = {}  # local rank -> its last worker's command and environment
    ready: dict[int, Standby] = {}

    @classmethod
    def resolve(cls, env: Mapping[str, str]) -> bool:
        if cls.wanted is None:
            setting = contract.standby(contract.plan_from_env())
            try:
                workers = int(env.get("LOCAL_WORLD_SIZE", "1"))
            except ValueError:
                workers = 1
            cls.wanted = os.environ.get(contract.PRELOAD) != "1" and choose(setting, preload.usable_cores(), workers)
        return cls.wanted

    @classmethod
    def take(cls, local_rank: int, args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """The worker of `local_rank` started in its standby (None: start it the usual way): only once a worker of
        this launcher made a step (its script imports torch: a fresh interpreter would import it too)."""
        cls.seen[local_rank] = (list(args), dict(env))
        standby = cls.ready.pop(local_rank, None)
        if standby is None:
            return None
        command = python_command(args)
        if command is None or command[0] != standby.interpreter or not _stepped() \
                or not standby.hand_over(args, env):
            standby.discard()
            return None
        logging.getLogger(__name__).info("worker local_rank=%d started in its standby interpreter (pid %d)",
                                         local_rank, standby.process.pid)
        return standby.process

    @classmethod
    def workers_started(cls) -> None:
        """After each worker start (the agent's): a standby for each local rank that has none, for the next start."""
        if not cls.wanted:
            return
        for local_rank, (args, env) in sorted(cls.seen.items()):
            if local_rank not in cls.ready:
                standby = start(args, env, IMPORTS)
                if standby is not None:
                    cls.ready[local_rank] = standby

    @classmethod
    def close(cls) -> None:
        """At the job's end: no standby outlives it."""
        for standby in cls.ready.values():
            standby.discard()
        cls.ready.clear()


def _stepped() -> bool:
    """A worker of this launcher noted its first step (`stop.mark_stepped`)."""
    marker = os.environ.get(stop.ENV)
    return marker is not None and stop.stepped_marked(Path(marker))


def start(args: Sequence[str], env: Mapping[str, str], imports: Sequence[str]) -> Standby | None:
    """A standby for a worker started as `args` with `env`; None where it cannot be one (not `python -m`)."""
    command = python_command(args)
    if command is None:
        return None
    read_fd, write_fd = os.pipe()
    try:
        process = subprocess.Popen([*command[0], "-m", MODULE, str(read_fd), ",".join(imports)], env=dict(env),
                                   pass_fds=(read_fd,), start_new_session=True)
    except OSError:
        os.close(write_fd)
        return None
    finally:
        os.close(read_fd)
    return Standby(process, write_fd, command[0])


# --- the seam: torch elastic's handler, through resctl's subclass ----------------------------------------------------


def handler_class(base: type) -> type:
    """`base` (torch elastic's `SubprocessHandler`, torch's or NVRx 0.4's copy) starting its worker in a standby."""

    class StandbyHandler(base):  # type: ignore[misc, valid-type]
        def _popen(self, args: Any, env: dict[str, str]) -> Any:
            taken = Standbys.take(self.local_rank_id, args, env)
            return taken if taken is not None else super()._popen(args, env)

    return StandbyHandler


def install(patches: Patches) -> None:
    """Each handler module's `get_subprocess_handler` builds `handler_class(its SubprocessHandler)` for a worker whose
    output is not redirected (torch's or NVRx's files or pipes are handed to a new process only)."""
    for name in HANDLER_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        previous = module.get_subprocess_handler
        patches.set(module, "get_subprocess_handler", _factory(previous, handler_class(module.SubprocessHandler)))


def _factory(previous: Callable[..., Any], handler: type) -> Callable[..., Any]:
    def get_subprocess_handler(*args: Any, **kwargs: Any) -> Any:
        plain = args or kwargs.get("stdout") or kwargs.get("stderr") or kwargs.get("numa_options") is not None
        if plain or not Standbys.resolve(kwargs.get("env") or {}):
            return previous(*args, **kwargs)
        return handler(**kwargs)

    return get_subprocess_handler


# --- in the standby ------------------------------------------------------------------------------------------------


def early_read(name: str) -> bool:
    return not (prestart.late_read(name) or name in WORKER_LATE)


def become(args: list[str], env: dict[str, str], started: Mapping[str, str]) -> None:
    """In the standby: run the worker's command (`python -m MODULE ARGS` in this interpreter), or exec it afresh.
    `started`: the environment this interpreter started with (what its imports set since, such as inductor's
    TORCHINDUCTOR_CACHE_DIR, a fresh worker importing the same would set too)."""
    command = python_command(args)
    differs = prestart.changed(started, env)
    early = sorted(name for name in differs if early_read(name))
    if command is None or command[0] != [sys.executable, *sys.orig_argv[1:sys.orig_argv.index("-m")]] or early:
        prestart.log_line(env, f"resctl: a standby interpreter starts its worker afresh (pid {os.getpid()}: "
                               + (", ".join(early) + " not as it started)" if early else "another command)"))
        os.execve(args[0], args, env)
    prestart.adopt(differs, env)
    lifeline.die_with_parent(0)  # a fresh worker has no parent-death signal until the shim sets its own
    preload.ImportWarnings.replay()
    sys.argv = [args[0], *command[2]]  # run_module puts the module's path first, as `python -m` does
    runpy.run_module(command[1], run_name="__main__", alter_sys=True)


def main(argv: Sequence[str]) -> None:
    """`python -m resctl.launch.standby FD IMPORTS`: import IMPORTS (comma list), wait for the worker's plan on FD."""
    started = dict(os.environ)
    prestart.listen(int(argv[0]))  # the pipe closed without a plan (the launcher ended or let it go): exit 0
    set_title(f"resctl-standby local={started.get('LOCAL_RANK', '?')}")  # `ps` tells it from a worker
    lifeline.die_with_parent(signal.SIGKILL, lifeline.expected(os.environ, lifeline.LAUNCHER_PID_ENV))
    with preload.ImportWarnings.recording(), preload.collector_off(freeze=False):  # the worker's own collector after
        for name in filter(None, argv[1].split(",")):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the worker imports it (and reports) itself
                continue
    become(*prestart.received(), started)


if __name__ == "__main__":
    main(sys.argv[1:])
