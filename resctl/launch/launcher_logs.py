"""What ft_launcher logs, kept fit for a console: no secrets, no tracebacks for an ordinary stop,
and by default not on the console at all.

- **Quiet console.** With `RESCTL_RUN_DIR` set and not `RESCTL_VERBOSE=1`, the launcher's log
  lines and warnings (torch elastic's, NVRx 0.4's root logging and NVRx >= 0.5's own `nvrx` logger)
  and its rank monitors' output go to `<run_dir>/launcher.log` (the logging root handler; a
  monitor's standard streams); the console keeps the workers' own output (the process's stdout and
  stderr, which workers inherit, are untouched) and one line per worker-group restart.

The redaction:

Installed in the launcher process by `resctl.launch.ft_entry` before NVRx is imported, as a log record
factory (so it covers every logger NVRx and torch elastic create, in the launcher and in processes
forked from it):

- the "Starting elastic_operator with launch configs" record carries `rdzv_configs`; values that are not
  known harmless settings are masked (`resctl.redact`), since a rendezvous token may be passed there;
- when the launcher is stopped by a signal (SIGTERM from Kubernetes or Slurm), NVRx logs the
  `SignalException` and the workers' exits with full tracebacks, and asyncio logs the rank monitor's
  cancelled connections. The message stays; the traceback goes. A traceback that does not come from
  the stop is left alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import sys
from typing import Any

from resctl.patching import Patches
from resctl.profile import contract
from resctl.redact import redact_rdzv_conf, redact_text

_STOP_EXCEPTIONS = ("SignalException",)


def _from_stop(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 20:
        if type(exc).__name__ in _STOP_EXCEPTIONS or isinstance(exc, asyncio.CancelledError):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def scrub(record: logging.LogRecord) -> logging.LogRecord:
    """The record with rdzv_configs values masked, a stop's traceback dropped, and secret-shaped
    text (a worker's error quoting a URL with its token) masked in the message and traceback (in place)."""
    args: Any = record.args
    if isinstance(args, dict) and isinstance(args.get("rdzv_configs"), dict):
        record.args = {**args, "rdzv_configs": redact_rdzv_conf(args["rdzv_configs"])}
    if record.exc_info and _from_stop(record.exc_info[1]):
        record.exc_info, record.exc_text = None, None
        record.msg = f"{record.msg} (traceback omitted: the launcher is stopping on a signal)"
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string is logging's to report, at emit
        return record
    masked = redact_text(message)
    if masked != message:
        record.msg, record.args = masked, None
    if record.exc_info and record.exc_info[1] is not None:
        record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
    return record


def install() -> None:
    """Route every log record of this process through `scrub`; once is enough, twice is harmless."""
    factory = logging.getLogRecordFactory()
    if getattr(factory, "_resctl_scrub", False):
        return

    def scrubbing_factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        return scrub(factory(*args, **kwargs))

    scrubbing_factory._resctl_scrub = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(scrubbing_factory)


LOG_FILE = "launcher.log"
FAILED_MESSAGE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")  # torch elastic: a worker's failure
# NVRx 0.4.1's restart lines. Both count the restart about to happen as left: "3/3 attempts left"
# is logged before the first restart, so after it 2 of 3 are left.
#   any-failed:  "[default] Worker group FAILED. 3/3 attempts left; will restart worker group"
#   min-healthy (in-process restart on): "3/3 restart attempts left; restarting worker group..."
RESTART_MESSAGE = re.compile(r"(\d+)/(\d+) (?:restart )?attempts left;? (?:will restart|restarting) worker group")
# any-failed, a node joined: a restart that is no fault and uses no attempt
JOINED_MESSAGE = re.compile(r"Detected (\d+) new nodes from group_rank=\d+; will restart worker group")


def restart_line(message: str, failure: str) -> str | None:
    """The console line for one NVRx log message, or None when it is not a restart.
    `failure` names the worker failure logged before it ("" when none was)."""
    restart = RESTART_MESSAGE.search(message)
    if restart:
        left, total = int(restart.group(1)) - 1, int(restart.group(2))
        return (f"resctl: {failure or 'a worker failed'}; restarting the workers, {left} of {total} restarts left "
                "(details: launcher.log in the run directory)")
    joined = JOINED_MESSAGE.search(message)
    if joined:
        return f"resctl: {joined.group(1)} node(s) joined; restarting the workers (no restart used)"
    return None


def failure_cause(message: str, record: logging.LogRecord) -> str:
    """What ended a worker, worded alike for forked workers (torch's ProcessExitedException: "process 1
    terminated with signal SIGKILL") and exec'd ones (an exit code alone): "terminated by signal SIGKILL",
    "exit code 3"; a worker's own error: the last line of its traceback."""
    exc = record.exc_info[1] if record.exc_info else None
    failed = FAILED_MESSAGE.search(message)
    code = int(failed.group(1)) if failed else None
    died = exc is None or type(exc).__name__ == "ProcessExitedException"  # no error of its own to quote
    if code is not None and code < 0 and died:
        return f"terminated by signal {_signal_name(-code)}"
    if exc is not None and died:
        return f"exit code {code}"
    lines = [line.strip() for line in (message + "\n" + (str(exc) if exc else "")).splitlines() if line.strip()]
    return lines[-1] if len(lines) > 1 else f"exit code {code}"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


class FaultLines(logging.Handler):
    """Console handler of a quiet launcher: one `resctl:` line per worker-group restart, naming the
    failure before it (its last traceback line); the rest of both records is in launcher.log."""

    def __init__(self, console: Any) -> None:
        super().__init__(logging.INFO)
        self.console = console
        self.failure = ""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            failed = FAILED_MESSAGE.search(message)
            if failed:
                self.failure = f"local rank {failed.group(2)} failed ({failure_cause(message, record)[:200]})"
                return
            line = restart_line(message, self.failure)
            if line is not None:
                self.console.write(line + "\n")
                self.console.flush()
                self.failure = ""
        except Exception:  # noqa: BLE001 - a console line is never worth a launcher crash
            self.handleError(record)


#: NVRx >= 0.5 logs through a logger of its own that its `setup_logger` gives a console handler (and no
#: propagation to the root) unless the logger has a handler already.
NVRX_LOGGER = "nvrx"


_QUIET: list[str] = []  # once per process
#: What the quiet launcher changed in loggers a forked worker uses too: undone in every forked child
#: (resctl.launch.adapters), whose console is the script's.
IN_LAUNCHER = Patches("quiet launcher's loggers")


def quiet_logs(env: Any = os.environ) -> str | None:
    """Send the launcher's log lines, its warnings and its rank monitors' lines to
    `<run_dir>/launcher.log`, keeping one console line per worker-group restart; returns the file,
    or None when the console keeps them (`RESCTL_VERBOSE=1`, no run dir). The process's own
    stdout and stderr, which the workers inherit, are left alone."""
    run_dir = env.get(contract.RUN_DIR)
    if not run_dir or env.get(contract.VERBOSE) == "1" or _QUIET:
        return None
    _QUIET.append(run_dir)
    path = os.path.join(run_dir, LOG_FILE)
    log = open(path, "a", buffering=1, encoding="utf-8")
    logging.basicConfig(  # before NVRx's own basicConfig (at its import), which then does nothing
        stream=log, level=os.getenv("FT_LAUNCHER_LOGLEVEL", "INFO"),
        format=f"[%(asctime)s] [%(levelname)s] [ft_launcher{os.getpid()}] %(message)s",
    )
    logging.captureWarnings(True)
    logging.getLogger().addHandler(FaultLines(sys.stderr))
    nvrx, null = logging.getLogger(NVRX_LOGGER), logging.NullHandler()
    nvrx.addHandler(null)  # NVRx's setup_logger keeps its console handler out then ...
    IN_LAUNCHER.on_undo(lambda: nvrx.removeHandler(null))
    IN_LAUNCHER.set(nvrx, "propagate", True)  # ... and its records reach the root: launcher.log, restart lines
    _torch_logs_to(log)
    return path


def _torch_logs_to(log: Any) -> None:
    """torch gives its top loggers ("torch", "torch.distributed") a console handler of their own and no
    propagation; NVRx >= 0.6 runs torch's elastic agent, whose worker failures log there: into the log
    file instead, and through the restart lines' handler."""
    import torch  # noqa: F401  # deferred: at the top, torch would load before ft_entry.main()'s first steps

    for name in ("torch", "torch.distributed"):
        logger = logging.getLogger(name)
        if logger.propagate:
            continue
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler.stream, "name", "") == "<stderr>":
                IN_LAUNCHER.set(handler, "stream", log)
    dist, lines = logging.getLogger("torch.distributed"), [h for h in logging.getLogger().handlers if isinstance(h, FaultLines)]
    for handler in lines:
        dist.addHandler(handler)
        IN_LAUNCHER.on_undo(lambda handler=handler: dist.removeHandler(handler))  # type: ignore[misc]


def monitor_to_log(env: Any = os.environ) -> bool:
    """In a rank monitor (forked from a quiet launcher): its standard streams go to launcher.log, so
    whatever it prints or logs (NVRx re-creates its loggers there, on stderr) stays off the console;
    False when the console keeps them (`RESCTL_VERBOSE=1`, no run dir)."""
    run_dir = env.get(contract.RUN_DIR)
    if not run_dir or env.get(contract.VERBOSE) == "1":
        return False
    try:
        fd = os.open(os.path.join(run_dir, LOG_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return False
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    return True
