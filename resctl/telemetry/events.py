"""One JSON object per line, per rank: `<run_dir>/events-rank<R>.jsonl`.

Every record has `t` (unix seconds), `kind`, `rank`, `cycle` (launcher restart count) and
`iteration` (in-process restart count). Kinds and their extra fields:

- `start`      pid, host, world_size, script
- `step`       step, duration (seconds since the previous step event)
- `ckpt_stall` step, seconds (time the training loop was blocked by a save), waited (for the previous save)
- `ckpt_persist` step, seconds (stage-to-durable), bytes
- `ckpt_prune` removed, seconds
- `ckpt_skip`  step, reason, quarantined (where a damaged checkpoint was moved, or null): `load` refused it
- `ckpt_fail`  step, error, consecutive, limit: a checkpoint write failed (retried at the next interval)
- `ckpt_other_run` step, run_id, path: `load` resumed from a checkpoint another run wrote
- `fault`      cause ("exception", "sigkill", "hang", "checkpoint_exception", "sigterm"), error, injected
- `restart`    layer: "inprocess" (a new wrapper iteration) or "launcher" (the first record of a
               worker started in a new ft_launcher cycle, right after its `start`)
- `resume`     step (the checkpoint step restored; 0 = from scratch)
- `end`        status ("ok", "error")

Appends are one `write()` of a whole line on an O_APPEND descriptor, so a line is never torn
by a concurrent writer, and a crash loses at most the line being written.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

EVENTS_GLOB = "events-rank*.jsonl"


def events_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"events-rank{rank}.jsonl"


class EventLog:
    """Appends events for one rank; `cycle` and `iteration` are stamped on every record."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, rank: int, cycle: int = 0) -> None:
        self.rank = rank
        self.cycle = cycle
        self.iteration = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        if run_dir is not None:
            path = events_path(run_dir, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def emit(self, kind: str, **fields: Any) -> None:
        if self._fd is None:
            return
        record = {"t": time.time(), "kind": kind, "rank": self.rank, "cycle": self.cycle, "iteration": self.iteration}
        record.update(fields)
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class _NullLog(EventLog):
    def __init__(self) -> None:
        super().__init__(None, rank=0)


NULL_LOG: EventLog = _NullLog()


def host() -> str:
    return socket.gethostname()


def read_events(run_dir: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """All events of a run, rank files in turn; a torn last line (crash mid-write) is skipped."""
    for path in sorted(Path(run_dir).glob(EVENTS_GLOB)):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
