"""The rendezvous store as the launcher's handler uses it: a lost connection to it stops the job with
a reason and `EXIT_STORE_LOST` (issue 42), instead of torch's store traceback and exit 1.

Nothing of a rendezvous survives its store: the keys (members, rounds, the workers' key spaces) live
in the store's memory only, and a TCPStore client does not reconnect. So the first failed request of
the launcher's handler (`num_nodes_waiting` / `next_round_open`, which the agent asks at every
monitor poll, or any request of a restart round) records why in fatal.json and stops this launcher
as its own SIGTERM would: the workers get the job stop (a final save where they can make one), and
`resctl run` exits `EXIT_STORE_LOST` with the message below on every node. A scheduler's restart of
the job (a Job's backoff, a Slurm requeue) then meets a restarted store and resumes from the last
checkpoint. The keep-alive thread uses its own, unguarded connection: a missed beat is allowed for.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, NoReturn

from resctl.errors import EXIT_STORE_LOST
from resctl.profile import contract

log = logging.getLogger(__name__)


def is_connection_loss(err: BaseException) -> bool:
    """A TCPStore request failed because the store's connection is gone (torch's DistNetworkError:
    refused, reset, broken pipe, end of stream), not a timeout of a wait."""
    import torch.distributed as dist

    return isinstance(err, dist.DistNetworkError)


class StoreGuard:
    """`store` with each request's connection loss handed to `lost` (which does not return)."""

    def __init__(self, store: Any, lost: Callable[[BaseException], NoReturn]) -> None:
        self._guarded, self._lost = store, lost

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._guarded, name)
        if not callable(attr):
            return attr

        def request(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except Exception as err:
                if is_connection_loss(err):
                    self._lost(err)
                raise

        return request


class StoreLost:
    """What a launcher does when its rendezvous store is gone: once, the reason and the job's stop;
    after that (the launcher's own shutdown still asks the store) the error as it is."""

    def __init__(self, endpoint: str, external: bool) -> None:
        self.endpoint, self.external = endpoint, external
        self._once = threading.Lock()
        self._stopped = False

    def message(self, err: BaseException) -> str:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        where = ("the `resctl store` process is gone: restart it, then the job (it resumes from its last checkpoint)"
                 if self.external else "the node that hosted it (is_host) is gone; launch.store = \"external\" with "
                 "`resctl store` keeps the store off the training nodes, so that losing any node is a restart round")
        return (f"the rendezvous store at {self.endpoint} is unreachable ({first}); no restart round can be held "
                f"without it, so the job stops (exit {EXIT_STORE_LOST}): {where} (docs/recovery.md)")

    def __call__(self, err: BaseException) -> NoReturn:
        with self._once:
            first, self._stopped = not self._stopped, True
        if not first:
            raise err
        from nvidia_resiliency_ext.fault_tolerance.launcher import SignalException

        text = self.message(err)
        log.error("%s", text)
        run_dir = os.environ.get(contract.RUN_DIR)
        if run_dir:
            contract.record_fatal(Path(run_dir), {"cause": "store_lost", "error": text, "exit_code": EXIT_STORE_LOST})
        os.kill(os.getpid(), signal.SIGTERM)  # the job's stop, as any other (remembered: no restart after it)
        raise SignalException(f"Process {os.getpid()} got signal: {int(signal.SIGTERM)}", sigval=signal.SIGTERM)


def endpoint_of(store: Any) -> str:
    """HOST:PORT of a TCPStore ("the rendezvous store" for another kind)."""
    host, port = getattr(store, "host", None), getattr(store, "port", None)
    return f"{host}:{port}" if host is not None and port is not None else "(its endpoint)"
