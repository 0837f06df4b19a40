"""Events: one JSON object per line, per rank, in `<run_dir>/events-rank<R>.jsonl`.

`KINDS` below is the one definition of every event kind: its fields, their types and units, which
are optional. `EventLog.emit` refuses a kind or a missing field it does not define, `read_run`
validates every line against it, and docs/events.md is rendered from it (`render_markdown`).
`report`, `tune-interval` and the Prometheus metrics read nothing else.

Appends are one `write()` of whole lines on an O_APPEND descriptor, so a line is never torn
by a concurrent writer, and a crash loses at most the line being written. `step` events, one per
optimizer step, are the exception: `EventLog.step` keeps them in memory and writes them in one
batch every `STEP_FLUSH_EVERY` seconds (or `STEP_BATCH` steps), before any other event (so the file
stays in order) and at `flush()`/`close()`; a SIGKILL loses at most the last batch. A reader skips (and
counts) any line it cannot use: a torn last line, bytes that are not UTF-8, a `null` or a
nesting too deep to parse, a record of the wrong shape.
"""

from __future__ import annotations

import heapq
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from resctl.drills import CAUSES
from resctl.redact import redact_text

EVENTS_GLOB = "events-rank*.jsonl"
#: Seconds a step event may wait in memory before it is written: what a SIGKILLed rank loses, so what `resctl report`'s
#: detection of a kill -9 overstates (it times such a fault from the last step written). 1 s read as 0.75 s of
#: "detection" in the H100's kill -9 drills (2026-12-07); ten writes a second cost nothing a step measures.
STEP_FLUSH_EVERY = 0.1
STEP_BATCH = 1024  # steps written at once at most
_RANK_FILE = re.compile(r"^events-rank(\d+)\.jsonl$")

Event = dict[str, Any]  # a record that passed `validate`: every field of its kind present, typed


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # "int", "float", "str", "bool"
    unit: str
    doc: str
    optional: bool = False  # may be absent or null; readers see None then


@dataclass(frozen=True)
class Kind:
    name: str
    doc: str
    fields: tuple[Field, ...]
    writer: str  # the module that emits it


COMMON = (
    Field("t", "float", "s", "unix time of the record"),
    Field("kind", "str", "", "one of the kinds below"),
    Field("rank", "int", "", "global rank of the worker"),
    Field("cycle", "int", "", "ft_launcher restart count (TORCHELASTIC_RESTART_COUNT); 0 when absent"),
    Field("iteration", "int", "", "in-process restart count within the cycle; 0 when absent"),
)

_STEP_OPT = Field("step", "int", "step", "training step the checkpoint holds; null when unknown", optional=True)

KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("start", "a worker process began (before the script runs)", (
        Field("pid", "int", "", "process id", optional=True),
        Field("host", "str", "", "host name", optional=True),
        Field("world_size", "int", "", "WORLD_SIZE", optional=True),
        Field("script", "str", "", "the script or module run", optional=True),
        Field("spawned", "float", "s", "unix time the process was created (fork or exec by the launcher, "
              "10 ms resolution): the end of the launcher's rendezvous, for the report's recovery phases",
              optional=True),
        Field("detected", "float", "s", "a restarted cycle's: unix time this node's launcher saw the cycle before "
              "fail (its monitor; a peer's restart: its stop began)", optional=True),
        Field("stopped", "float", "s", "a restarted cycle's: unix time this node's launcher had stopped the cycle "
              "before's workers", optional=True),
    ), "resctl.shim.runtime"),
    Kind("step", "an optimizer step finished", (
        Field("step", "int", "step", "the step's number (continues from the resumed step)"),
        Field("duration", "float", "s", "time since the previous step event (or the start / resume)"),
        Field("busy", "float", "s", "this rank's own work in the step: its duration less the time it was blocked "
              "in collectives (Work.wait, DDP's gradient all-reduce; CUDA events on a GPU), where the others wait "
              "for it; in a synchronous job once steps are >= 10 ms (resctl.shim.busy)", optional=True),
    ), "resctl.shim.runtime"),
    Kind("ckpt_stall", "a save returned to the training loop", (
        _STEP_OPT,
        Field("seconds", "float", "s", "time the training loop was blocked by the save"),
        Field("waited", "float", "s", "part of `seconds` spent waiting for the previous save", optional=True),
        Field("path", "str", "", "file of an intercepted torch.save, directory of the script's dcp.async_save",
              optional=True),
    ), "resctl.checkpoint"),
    Kind("ckpt_persist", "a checkpoint (or this rank's part of it) became durable", (
        _STEP_OPT,
        Field("seconds", "float", "s", "staged to durable"),
        Field("bytes", "int", "B", "bytes written by this rank", optional=True),
        Field("recycled", "bool", "", "written over the files of a pruned checkpoint", optional=True),
        Field("path", "str", "", "file of an intercepted torch.save, directory of the script's dcp.async_save",
              optional=True),
    ), "resctl.checkpoint"),
    Kind("ckpt_prune", "old checkpoints were removed", (
        Field("removed", "int", "", "checkpoints removed"),
        Field("seconds", "float", "s", "time the prune took"),
    ), "resctl.checkpoint.engine"),
    Kind("ckpt_skip", "load passed over a checkpoint it could not use", (
        _STEP_OPT,
        Field("reason", "str", "", "why it was skipped"),
        Field("quarantined", "str", "", "where the damaged checkpoint was moved (null: left in place); "
              "checkpoint.keep_quarantined may have deleted it since", optional=True),
    ), "resctl.checkpoint.engine"),
    Kind("ckpt_fail", "a checkpoint write failed (retried at the next interval)", (
        _STEP_OPT,
        Field("error", "str", "", "the error"),
        Field("consecutive", "int", "", "failed saves in a row, this one included"),
        Field("limit", "int", "", "checkpoint.max_failed_saves: the job stops when consecutive reaches it"),
    ), "resctl.checkpoint.engine"),
    Kind("ckpt_other_run", "load resumed from a checkpoint another run wrote", (
        _STEP_OPT,
        Field("run_id", "str", "", "the run that wrote it", optional=True),
        Field("path", "str", "", "the checkpoint directory"),
    ), "resctl.checkpoint.engine"),
    Kind("ckpt_mem", "a memory-tier snapshot was committed (complete in host shared memory); written when the "
         "background commit ends, so the loop was blocked during `[t - commit - seconds, t - commit]`", (
        Field("step", "int", "step", "training step the snapshot holds"),
        Field("seconds", "float", "s", "time the training loop was blocked (the copy, and `waited`)"),
        Field("waited", "float", "s", "part of `seconds` spent waiting for the previous commit or a disk write "
              "from the slot", optional=True),
        Field("commit", "float", "s", "copied to committed (checksum, manifest) in the background", optional=True),
        Field("bytes", "int", "B", "bytes of the snapshot", optional=True),
    ), "resctl.checkpoint.memory"),
    Kind("ckpt_replica", "a memory-tier snapshot was copied whole into the buddy node's host memory", (
        Field("step", "int", "step", "training step the snapshot holds"),
        Field("seconds", "float", "s", "time of the transfer, in the background (training did not wait)"),
        Field("bytes", "int", "B", "bytes of the snapshot's data"),
        Field("buddy", "str", "", "the buddy node's replica server (host:port)"),
    ), "resctl.checkpoint.replica"),
    Kind("ckpt_replica_fail", "a copy to the buddy node failed (said once per kind of failure; the next snapshot "
         "tries again)", (
        Field("step", "int", "step", "training step of the snapshot that was not copied"),
        Field("buddy", "str", "", "the buddy node's replica server (host:port)"),
        Field("error", "str", "", "the error"),
    ), "resctl.checkpoint.replica"),
    Kind("ckpt_mem_off", "the memory tier failed and this process stopped taking memory snapshots", (
        Field("error", "str", "", "the error (e.g. /dev/shm full)"),
    ), "resctl.checkpoint.engine"),
    Kind("ckpt_load", "load restored a checkpoint, from one tier", (
        Field("step", "int", "step", "the restored step"),
        Field("tier", "str", "", "memory (this node's shared memory), buddy (the copy in the buddy node's memory, "
              "fetched back over the network) or disk"),
        Field("seconds", "float", "s", "time from choosing the tier to the state restored"),
        Field("bytes", "int", "B", "bytes restored (memory and buddy tiers)", optional=True),
    ), "resctl.checkpoint.engine"),
    Kind("snapshot", "the script's own torch.save to a file, or its own DCP save, returned (zero-edit snapshot)", (
        Field("step", "int", "step", "optimizer steps made when torch.save (dcp.save) was called", optional=True),
        Field("path", "str", "", "absolute path torch.save was given (DCP: the checkpoint directory)"),
        Field("seconds", "float", "s", "time torch.save (dcp.save, dcp.async_save) blocked the script"),
        Field("bytes", "int", "B", "file size (DCP: the directory's; null while an intercepted or async write is in "
              "flight)", optional=True),
        Field("file_id", "str", "", "device:inode:size:mtime_ns of the written file (DCP: its .metadata; survives "
              "a rename)", optional=True),
        Field("pending", "bool", "", "true: intercepted, durable at the ckpt_persist with the same path",
              optional=True),
    ), "resctl.telemetry.snapshots"),
    Kind("fault", "the worker saw a fault (recorded before it acts on it)", (
        Field("cause", "str", "", ", ".join(CAUSES)),
        Field("error", "str", "", "the error message", optional=True),
        Field("injected", "bool", "", "fired by a fault drill", optional=True),
        Field("step", "int", "step", "step the worker had reached", optional=True),
        Field("traceback", "str", "", "Python traceback", optional=True),
    ), "resctl.shim"),
    Kind("restart", "a restart began on this worker", (
        Field("layer", "str", "", "inprocess (a new wrapper iteration) or launcher (a new ft_launcher cycle)"),
        Field("step", "int", "step", "step the worker had reached", optional=True),
        Field("world_size", "int", "", "ranks in the restarted in-process iteration", optional=True),
    ), "resctl.shim"),
    Kind("inprocess_world", "in-process restart may continue with fewer ranks (opt-in, inprocess.min_world_size)", (
        Field("min_world_size", "int", "", "fewest ranks an iteration may run with"),
        Field("world_size", "int", "", "ranks at the start"),
    ), "resctl.shim.inprocess"),
    Kind("resume", "state was restored", (
        Field("step", "int", "step", "the restored checkpoint's step; 0 = from scratch"),
        Field("load_seconds", "float", "s", "time the load took", optional=True),
        Field("path", "str", "", "the snapshot file torch.load read, the directory dcp.load read (zero-edit)",
              optional=True),
        Field("source", "str", "", "checkpoint (resctl.checkpoint.load), torch.load or dcp.load (a snapshot)",
              optional=True),
    ), "resctl.shim"),
    Kind("data_position", "a data loader's position was resumed, re-split, left alone or is approximate "
         "(checkpoint.data_position; docs/checkpoint.md)", (
        Field("loader", "str", "", "the loader: its name in the checkpoint state, or #N (the N-th the script iterated)"),
        Field("action", "str", "", "resumed, resplit, epoch (not fast-forwarded: the script set another epoch), "
              "self-skip, approximate, left (a loader with its own state_dict), unpositioned (a framework's "
              "checkpoint read from a file object: no position kept with it)"),
        Field("message", "str", "", "what the console line said"),
    ), "resctl.checkpoint.dataposition"),
    Kind("stop", "the ranks agreed on the step of the final checkpoint of a stopped job (docs/recovery.md)", (
        Field("step", "int", "step", "the stop step: every rank saves at its first step boundary at or after it"),
        Field("at", "int", "step", "the step boundary where this rank learnt it"),
        Field("proposed", "int", "step", "this rank's proposal (its next step boundary)", optional=True),
        Field("outcome", "str", "", "agreed, or alone (no agreement within half the grace: saved where it was)"),
        Field("seconds", "float", "s", "time the training thread waited for the agreement"),
        Field("why", "str", "", "alone: why no agreement was had (the ranks that proposed, the error)", optional=True),
    ), "resctl.shim.runtime"),
    Kind("straggler", "a rank's steps stayed slower than the other ranks' median by health.straggler_margin for "
         "health.straggler_steps steps in a row (said once per episode; `rank` is the slow rank)", (
        Field("step", "int", "step", "the rank's step when it was named"),
        Field("seconds", "float", "s", "the rank's recent step time (median of its last few steps)"),
        Field("median", "float", "s", "the other ranks' median recent step time"),
        Field("ratio", "float", "", "seconds / median"),
        Field("steps", "int", "", "slow steps in a row"),
        Field("margin", "float", "", "health.straggler_margin it was judged by", optional=True),
        Field("measure", "str", "", "what was compared: busy (each rank's own work outside the "
              "collectives it waits in, the step events' `busy`: a synchronous job) or step (step durations)",
              optional=True),
    ), "resctl.health.watch"),
    Kind("end", "the worker finished its script", (
        Field("status", "str", "", "ok, error, sigterm (a stop of the job), restart-stop (stopped by the launcher "
              "to restart the group)"),
        Field("step", "int", "step", "step the worker had reached", optional=True),
    ), "resctl.shim.runtime"),
)}

_PY = {"int": int, "float": float, "str": str, "bool": bool}
_CHECK: dict[str, tuple[tuple[str, type, bool], ...]] = {
    name: tuple((f.name, _PY[f.type], f.optional) for f in (*COMMON[:1], *COMMON[2:], *kind.fields))
    for name, kind in KINDS.items()
}
_ZERO_WHEN_ABSENT = ("cycle", "iteration")
_INT_MIN, _INT_MAX = -(2**63), 2**63 - 1  # what an event's integer may be (int64, as the readers' arrays hold)
_FLOAT_MAX = 1e15  # seconds (or unix time): 30 million years; sums of a run's values stay finite


def validate(obj: Any) -> Event | None:
    """The record with every field of its kind present and typed, or None when it is not one
    (not an object, unknown kind, a required field missing or of the wrong type). Fields in place:
    an absent optional one becomes None, an int where a float belongs a float, an integral float
    where an int belongs an int; bool is not a number, integers fit int64 and floats are within ±1e15."""
    if type(obj) is not dict or type(obj.get("kind")) is not str:
        return None
    check = _VALIDATORS.get(obj["kind"])
    return None if check is None else check(obj)


def _validate_slowly(obj: dict[str, Any], spec: tuple[tuple[str, type, bool], ...]) -> Event | None:
    for name, want, optional in spec:
        value: Any = obj.get(name)
        got = type(value)
        if got is want:
            if got is float and not -_FLOAT_MAX <= value <= _FLOAT_MAX:  # inf, nan, or beyond any real time
                return None
            if got is int and not _INT_MIN <= value <= _INT_MAX:  # no reader's arithmetic holds it
                return None
        elif value is None:
            if name in _ZERO_WHEN_ABSENT:
                obj[name] = 0
            elif optional:
                obj[name] = None
            else:
                return None
        elif want is float and got is int and -_FLOAT_MAX <= value <= _FLOAT_MAX:
            obj[name] = float(value)
        elif want is int and got is float and value - value == 0.0 and value.is_integer() and \
                _INT_MIN <= value <= _INT_MAX:
            obj[name] = int(value)
        else:
            return None
    return obj


def _validator(spec: tuple[tuple[str, type, bool], ...]) -> Callable[[dict[str, Any]], Event | None]:
    """`_validate_slowly` for one kind as straight-line code (the reader runs it on every line):
    a record already in canonical form passes without a loop; anything else takes the slow path."""
    body = ["def check(obj):", "    get = obj.get"]
    for name, want, optional in spec:
        body.append(f"    v = get({name!r})")
        test = f"type(v) is not {want.__name__}" + {float: f" or not -{_FLOAT_MAX!r} <= v <= {_FLOAT_MAX!r}",
                                                       int: f" or not {_INT_MIN} <= v <= {_INT_MAX}"}.get(want, "")
        if optional and name not in _ZERO_WHEN_ABSENT:
            body += ["    if v is None:", f"        obj[{name!r}] = None", f"    elif {test}:"]
        else:
            body.append(f"    if {test}:")
        body.append("        return slow(obj, spec)")
    body.append("    return obj")
    scope: dict[str, Any] = {"slow": _validate_slowly, "spec": spec}
    exec("\n".join(body), scope)
    return scope["check"]  # type: ignore[no-any-return]


_VALIDATORS = {name: _validator(spec) for name, spec in _CHECK.items()}


def events_path(run_dir: str | os.PathLike[str], rank: int) -> Path:
    return Path(run_dir) / f"events-rank{rank}.jsonl"


def rank_files(run_dir: str | os.PathLike[str]) -> dict[int, Path]:
    """rank -> events file of a run directory."""
    out = {}
    for path in Path(run_dir).glob(EVENTS_GLOB):
        match = _RANK_FILE.match(path.name)
        if match:
            out[int(match.group(1))] = path
    return dict(sorted(out.items()))


class EventLog:
    """Appends events for one rank; `cycle` and `iteration` are stamped on every record."""

    def __init__(self, run_dir: str | os.PathLike[str] | None, rank: int, cycle: int = 0) -> None:
        self.rank = rank
        self.cycle = cycle
        self.iteration = 0
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._steps: list[tuple[float, int, int, float, float | None]] = []  # (t, iteration, step, duration, busy)
        self._flush_at = float("inf")
        if run_dir is not None:
            path = events_path(run_dir, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @property
    def enabled(self) -> bool:
        return self._fd is not None

    def emit(self, kind: str, **fields: Any) -> None:
        """Append one record; a kind or a required field that `KINDS` does not define is a bug
        in the caller and raises ValueError (tests catch it before a run does)."""
        spec = KINDS.get(kind)
        if spec is None:
            raise ValueError(f"unknown event kind {kind!r}; define it in resctl.telemetry.events.KINDS")
        missing = [f.name for f in spec.fields if not f.optional and f.name not in fields]
        if missing:
            raise ValueError(f"event {kind!r} needs {', '.join(missing)}")
        if self._fd is None:
            return
        record = {"t": time.time(), "kind": kind, "rank": self.rank, "cycle": self.cycle, "iteration": self.iteration}
        # Free text (an exception's message, a traceback) may quote a URL with its token: masked here,
        # so no reader of the run directory (report, metrics, the failure summary) ever sees it.
        record.update({k: redact_text(v) if isinstance(v, str) else v for k, v in fields.items()})
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            self._write(self._step_lines() + line)

    def step(self, step: int, duration: float, busy: float | None = None) -> None:
        """Record a `step` event (the per-step hot path: a few hundred nanoseconds). Written with
        the next batch: `STEP_FLUSH_EVERY` after the first unwritten one, or at the next event."""
        if self._fd is None:
            return
        now = time.time()
        with self._lock:
            self._steps.append((now, self.iteration, step, duration, busy))
            if now >= self._flush_at or len(self._steps) >= STEP_BATCH:
                self._write(self._step_lines())
            elif len(self._steps) == 1:
                self._flush_at = now + STEP_FLUSH_EVERY

    def flush(self) -> None:
        """Write the step events still in memory."""
        with self._lock:
            if self._fd is not None:
                self._write(self._step_lines())

    def _step_lines(self) -> bytes:
        steps, self._steps = self._steps, []
        self._flush_at = float("inf")
        head = f'"kind":"step","rank":{self.rank},"cycle":{self.cycle},"iteration":'
        # Six decimals as `round(x, 6)` gave, formatted without the round (a step's hot path pays this, batched).
        return "".join(
            f'{{"t":{t!r},{head}{it},"step":{n},"duration":{d:.6f}'
            + ("}\n" if b is None else f',"busy":{b:.6f}}}\n') for t, it, n, d, b in steps
        ).encode()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a regular file takes it whole; a short write (a signal, a full disk) continues
            view = view[os.write(self._fd, view):]  # type: ignore[arg-type]

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                self._write(self._step_lines())
                os.close(self._fd)
                self._fd = None


class _NullLog(EventLog):
    def __init__(self) -> None:
        super().__init__(None, rank=0)


NULL_LOG: EventLog = _NullLog()


def host() -> str:
    return socket.gethostname()


def process_started(pid: str = "self") -> float | None:
    """Unix time the process was created (Linux /proc; clock ticks, 10 ms), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK")), 3)


@dataclass
class ReadStats:
    """What a reader could not use, per file: `damaged` lines (not a valid record) and the first few
    places they were found."""

    lines: int = 0
    damaged: int = 0
    examples: list[str] = field(default_factory=list)

    def skip(self, path: Path, lineno: int, why: str) -> None:
        self.damaged += 1
        if len(self.examples) < 5:
            self.examples.append(f"{path.name}:{lineno}: {why}")


_DECODE = json.JSONDecoder().raw_decode


def parse_line(line: bytes) -> tuple[Event | None, str]:
    """(record, "") or (None, why it is not one)."""
    try:
        text = line.decode("utf-8")
        try:
            obj, end = _DECODE(text)
        except json.JSONDecodeError:
            text = text.strip()  # leading white space; else it fails again, below
            obj, end = _DECODE(text)
        if end != len(text) and not text[end:].isspace():
            return None, "not JSON (text after the record)"
    except RecursionError:
        return None, "nested too deep"
    except UnicodeDecodeError:
        return None, "not UTF-8"
    except ValueError:
        return None, "not JSON"
    event = validate(obj)
    if event is None:
        return None, "not an event record (see docs/events.md)"
    return event, ""


def read_file(path: Path, stats: ReadStats) -> Iterator[Event]:
    """Valid records of one events file, in file order; damaged lines are counted in `stats`."""
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            stats.lines += 1
            event, why = parse_line(line)
            if event is None:
                stats.skip(path, lineno, why if line.endswith(b"\n") else "torn last line")
                continue
            yield event


def read_run(run_dir: str | os.PathLike[str], stats: ReadStats | None = None) -> Iterator[Event]:
    """Every valid record of a run, all ranks merged by time (one pass, one line in memory per
    file: each rank's file is already in time order)."""
    stats = stats if stats is not None else ReadStats()
    streams = [read_file(p, stats) for p in rank_files(run_dir).values()]
    return heapq.merge(*streams, key=_time)


def _time(e: Event) -> float:
    return e["t"]  # type: ignore[no-any-return]


def reference_rank(files: Mapping[int, Path]) -> int | None:
    """The lowest rank whose file holds a valid record (the analysis's reference rank)."""
    for rank, path in sorted(files.items()):
        if next(read_file(path, ReadStats()), None) is not None:
            return rank
    return None


def read_events(run_dir: str | os.PathLike[str]) -> Iterator[Event]:
    """All valid events of a run, merged by time; damaged lines are skipped."""
    return read_run(run_dir)


def render_markdown() -> str:
    """docs/events.md, from `KINDS` (a test keeps the file equal to this)."""
    out = ["# Events", "", "<!-- generated by resctl.telemetry.events.render_markdown(); do not edit -->", "",
           __doc__.strip().split("\n\n", 1)[1].replace("`KINDS` below", "The table below"), "",
           "Every record has:", "", "| field | type | unit | meaning |", "|---|---|---|---|"]
    out += [f"| `{f.name}` | {f.type} | {f.unit} | {f.doc} |" for f in COMMON]
    for kind in KINDS.values():
        out += ["", f"## `{kind.name}`", "", f"{kind.doc[0].upper()}{kind.doc[1:]}. Written by `{kind.writer}`.", "",
                "| field | type | unit | optional | meaning |", "|---|---|---|---|---|"]
        out += [f"| `{f.name}` | {f.type} | {f.unit} | {'yes' if f.optional else ''} | {f.doc} |" for f in kind.fields]
    return "\n".join(out) + "\n"


def as_events(records: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Validated copies of in-memory records (tests and tools build runs this way); invalid ones dropped."""
    out = []
    for r in records:
        e = validate(dict(r))
        if e is not None:
            out.append(e)
    return out
