"""The launcher's interpreter, started before `resctl run` has read its command line (issue 43: the no-op job).

`resctl run` spent its first ~0.3 s (0.45 s on a GPU node) importing the CLI and resolving the profile before it
started the launcher, which then spent a second importing torch: in series, where torchrun has only the second.
So `python -m resctl` / `resctl` start the launcher's interpreter first (`begin`, before the CLI's own imports):
it imports torch, pydantic and the profile schema while the CLI works, then waits for the plan on a pipe. The CLI
hands it over (`hand_over`: the launcher's arguments and environment, as JSON) where it would have started the
launcher, and the launcher goes on as if started with them (`receive`). A CLI that starts no launcher (an error, a
dry run, a failed preflight) closes the pipe by exiting, and the waiting interpreter exits 0 without a word.

The environment the waiting interpreter started with is `resctl run`'s plus the plan's usual launcher values (the
RUN_PID lifeline, RESCTL_PRELOAD and PYTHONUNBUFFERED of forked workers). A plan whose environment differs from that
in a variable read before or while torch is imported (anything but resctl's own and `LATE_READ`'s: NCCL_*, FI_*, ...)
makes it exec itself with the plan's environment: what starting afresh would have given, at the old cost. So does
`RESCTL_PRESTART=0`. Never for `--dry-run` or `--help` (nothing to launch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any, Iterable, Mapping, Sequence

from resctl.profile import contract

AWAIT = "--await-plan"  # the waiting interpreter's only argument
ENTRY = "resctl.launch.ft_entry"
#: Variables nothing reads before the launcher's own code runs (torch reads none of them at import): resctl's own
#: (`contract.ENV`) and these prefixes; a plan may add or change them and the waiting interpreter takes them as they come.
#: PYTHONUNBUFFERED too: read at an interpreter's start, it sets only the launcher's own stdio (forked workers share
#: it: the waiting interpreter starts with the fork plan's value), while exec'd workers take it from the environment
#: this passes on (an exec plan drops it: their new interpreters start buffered, as under torchrun).
LATE_READ = ("TORCHELASTIC_", "NCCL_", "TORCH_NCCL_", "FI_", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "PYTHONUNBUFFERED")
_NO_LAUNCH = {"--dry-run", "--help", "-h"}
#: Popen arguments for a launcher in a process group of its own (execute.run says why)
OWN_GROUP: dict[str, Any] = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


class _Warm:
    process: subprocess.Popen[bytes] | None = None
    write_fd: int = -1


def wanted(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    """`resctl run ...` that will start a launcher (as far as the command line says before it is parsed)."""
    return (list(argv[:1]) == ["run"] and not _NO_LAUNCH.intersection(argv)
            and env.get(contract.PRESTART, "1") != "0")


def expected_env(env: Mapping[str, str], run_pid: int) -> dict[str, str]:
    """The environment the waiting interpreter starts with: `resctl run`'s, and what a default plan adds that is
    read at interpreter start or by `ft_entry` before the plan comes (resctl.launch.plan)."""
    added = {contract.RUN_PID: str(run_pid), contract.PRELOAD: "1"}
    if "PYTHONUNBUFFERED" not in env:  # as the plan sets it for forked workers
        added.update({"PYTHONUNBUFFERED": "1", contract.ADDED_ENV: "PYTHONUNBUFFERED"})
    return {**env, **added}


def begin(argv: Sequence[str]) -> None:
    """In `resctl run`, first: start the launcher's interpreter, waiting for the plan."""
    if not wanted(argv, os.environ):
        return
    read_fd, write_fd = os.pipe()
    env = expected_env(os.environ, os.getpid())
    env[contract.PRESTART_FD] = str(read_fd)
    try:
        _Warm.process = subprocess.Popen([sys.executable, "-m", ENTRY, AWAIT], env=env, pass_fds=(read_fd,),
                                         **OWN_GROUP)
        _Warm.write_fd = write_fd
    except OSError:
        os.close(write_fd)  # the launcher starts the usual way
    finally:
        os.close(read_fd)


def hand_over(program: Sequence[str], args: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
    """Give the waiting interpreter the launcher's command line and environment; None when there is none (the caller
    starts the launcher itself)."""
    process, fd = _Warm.process, _Warm.write_fd
    _Warm.process, _Warm.write_fd = None, -1
    if process is None:
        return None
    try:
        if process.poll() is not None or list(program) != [sys.executable, "-m", ENTRY]:
            return None
        owned, fd = fd, -1
        send(owned, args, env)
        return process
    except (BrokenPipeError, OSError):
        return None
    finally:
        if fd >= 0:
            os.close(fd)


def send(fd: int, args: Sequence[str], env: Mapping[str, str]) -> None:
    """Write a command line and environment into the pipe `fd` and close it (what `received` reads; the standby
    interpreters of exec'd workers take theirs the same way, `resctl.launch.standby`)."""
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(json.dumps({"args": list(args), "env": dict(env)}).encode())


# --- in the waiting interpreter ---------------------------------------------------------------------------------


def late_read(name: str) -> bool:
    return name in contract.ENV or name.startswith(LATE_READ)


def changed(now: Mapping[str, str], plan: Mapping[str, str]) -> set[str]:
    return {k for k in now.keys() | plan.keys() if now.get(k) != plan.get(k)}


class _Plan:
    listener: threading.Thread | None = None
    data = b""


def listen(fd: int | None = None) -> None:
    """In the waiting interpreter, first: read the plan in a thread, so that a CLI that launches nothing (its pipe
    closed with no plan: a bad profile, exit 2) ends this interpreter at once, not after torch's import (~1 CPU-s).
    The pipe is `fd`, else the one `contract.PRESTART_FD` names (a worker's standby: `resctl.launch.standby`)."""
    if fd is None:
        fd = int(os.environ.pop(contract.PRESTART_FD))

    def read() -> None:
        with os.fdopen(fd, "rb") as pipe:
            _Plan.data = pipe.read()
        if not _Plan.data:  # `resctl run` started no launcher
            os._exit(0)

    _Plan.listener = threading.Thread(target=read, name="resctl-await-plan", daemon=True)
    _Plan.listener.start()


def received() -> tuple[list[str], dict[str, str]]:
    """The command line and environment `send` wrote, once they came (`listen`)."""
    if _Plan.listener is None:
        listen()
    assert _Plan.listener is not None
    _Plan.listener.join()
    plan = json.loads(_Plan.data)
    return [str(a) for a in plan["args"]], {str(k): str(v) for k, v in plan["env"].items()}


def adopt(names: Iterable[str], env: Mapping[str, str]) -> None:
    """This process's environment takes `env`'s value of each of `names` (unset where `env` has none)."""
    for name in names:
        if name in env:
            os.environ[name] = env[name]
        else:
            os.environ.pop(name, None)


def receive() -> str:
    """In the waiting interpreter: take the plan (`listen`), then become the launcher it describes. Returns the line
    the launcher's log keeps of it."""
    args, env = received()
    differs = changed(os.environ, env) - {contract.LAUNCHER_PID}
    early = sorted(name for name in differs if not late_read(name))
    if early:
        log_line(env, f"resctl: the launcher's interpreter, started before the plan, starts again with the plan's "
                  f"environment ({', '.join(early)}: not as resctl run's)")
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", ENTRY, *args], env)
    adopt(differs, env)
    sys.argv[1:] = args
    return "resctl: the launcher's interpreter was started before the plan was made (resctl.launch.prestart)"


def log_line(env: Mapping[str, str], line: str) -> None:
    """A line in the launcher's log of the run `env` names (best effort)."""
    from resctl.launch.launcher_logs import LOG_FILE  # deferred: `resctl run` imports this module first thing

    try:
        with open(os.path.join(env[contract.RUN_DIR], LOG_FILE), "a", encoding="utf-8") as log:
            log.write(line + "\n")
    except (KeyError, OSError):
        pass
