"""What ft_launcher logs, kept fit for a console: no secrets, no tracebacks for an ordinary stop.

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
from typing import Any

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
    """The record with rdzv_configs values masked and a stop's traceback dropped (in place)."""
    from resctl.redact import redact_rdzv_conf

    args: Any = record.args
    if isinstance(args, dict) and isinstance(args.get("rdzv_configs"), dict):
        record.args = {**args, "rdzv_configs": redact_rdzv_conf(args["rdzv_configs"])}
    if record.exc_info and _from_stop(record.exc_info[1]):
        record.exc_info, record.exc_text = None, None
        record.msg = f"{record.msg} (traceback omitted: the launcher is stopping on a signal)"
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
