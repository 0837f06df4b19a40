"""The launcher's health gate: before each new cycle's workers start, did the last one progress, and whose fault
ended it?

resctl's adapters call `before_cycle()` at the top of the launcher's `_start_workers` (the first cycle
and every restart), where NVRx >= 0.6 makes the same decision; so the stop spends no further restart
and needs no worker's help. It reads only what the workers appended to the run directory's events
files since the previous call, and of that only the last `SCAN_BYTES` of each file (steps only grow
within a cycle, so the highest one is at the end): a restart after a day of steps reads a few
milliseconds' worth. When `health.no_progress_cycles` cycles in a row made no progress, it writes the
reason to fatal.json and stops its own launcher with SIGTERM before any worker starts; `resctl run`
prints the reason and exits 93 (`resctl.errors.EXIT_NO_PROGRESS`).

`health.node_fault_limit`: the same lines say which ranks ended the cycle (died without a record, else
the first to fault); when they were this node's `node_fault_limit` times, this node is kept out
(`health.keep_out`, `resctl.health.placement`) and its launcher stops the same way (exit 1, cause bad_node).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resctl.errors import EXIT_FAILURE, EXIT_NO_PROGRESS
from resctl.health.progress import NoProgress, ProgressTracker
from resctl.profile import contract
from resctl.telemetry.events import parse_line, rank_files

SCAN_BYTES = 1 << 20  # of each file's new lines: its end (the cycle's last steps, its faults and ends)
HEAD_BYTES = 1 << 16  # and its beginning (the cycle's start lines)
_KINDS = (b'"step"', b'"resume"', b'"start"', b'"fault"', b'"end"')


@dataclass(frozen=True)
class BadNodeVerdict:
    """This node ended `faults` cycles by its own fault (health.node_fault_limit)."""

    faults: int
    limit: int
    ranks: list[int]

    def message(self) -> str:
        return (f"this node ended {self.faults} launcher cycle(s) by its own fault (rank(s) "
                f"{', '.join(map(str, self.ranks))} last; health.node_fault_limit = {self.limit})")


@dataclass
class Cycle:
    """What one cycle's new lines say: the best step, the resumed step, and who started, spoke and faulted."""

    reached: int | None = None
    resumed: int | None = None
    started: set[int] = field(default_factory=set)
    said: set[int] = field(default_factory=set)  # ranks with a fault or an end record
    first_fault: tuple[float, int] | None = None  # (t, rank) of the earliest fault

    def take(self, line: bytes) -> None:
        if not any(k in line for k in _KINDS):
            return
        e, _ = parse_line(line)
        if e is None:
            return
        kind, rank = e["kind"], e["rank"]
        if kind == "step":
            self.reached = e["step"] if self.reached is None else max(self.reached, e["step"])
        elif kind == "resume":
            self.resumed = e["step"] if self.resumed is None else max(self.resumed, e["step"])
        elif kind == "start":
            self.started.add(rank)
        elif kind in ("fault", "end"):
            self.said.add(rank)
            if kind == "fault" and (self.first_fault is None or e["t"] < self.first_fault[0]):
                self.first_fault = (e["t"], rank)

    def culprits(self) -> set[int]:
        """The ranks that ended the cycle: those that died without a word (a signal, the OOM killer: the others'
        errors followed from it), else the first to fault (as the failure summary reads it)."""
        silent = self.started - self.said
        if silent:
            return silent
        return {self.first_fault[1]} if self.first_fault else set()


class Gate:
    def __init__(self, run_dir: Path, limit: int, fault_limit: int = 0, keep_out: str = "off") -> None:
        self.run_dir = run_dir
        self.tracker = ProgressTracker(limit)
        self.fault_limit = fault_limit
        self.keep_out = keep_out
        self.own_faults = 0
        self._sizes: dict[Path, int] = {}
        self._started = False

    def before_cycle(self, own_ranks: Iterable[int] = ()) -> NoProgress | BadNodeVerdict | None:
        """Called before each cycle's workers start (`own_ranks`: the ranks this node's launcher ran in the
        cycle that ended); a verdict once a limit is reached."""
        cycle = self._scan()
        if not self._started:  # the first cycle: what is there is an earlier run's (a requeue)
            self._started = True
            return None
        mine = cycle.culprits() & set(own_ranks)
        if self.fault_limit and mine:
            self.own_faults += 1
            if self.own_faults >= self.fault_limit:
                return BadNodeVerdict(self.own_faults, self.fault_limit, sorted(mine))
        if self.tracker.limit <= 0:
            return None
        return self.tracker.cycle_ended(cycle.reached, cycle.resumed)

    def _scan(self) -> Cycle:
        cycle = Cycle()
        for path in rank_files(self.run_dir).values():
            start = self._sizes.get(path, 0)
            try:
                size = path.stat().st_size
                with open(path, "rb") as fh:
                    fh.seek(start)
                    head = fh.read(min(HEAD_BYTES, size - start))
                    begin = max(start + len(head), size - SCAN_BYTES)
                    fh.seek(begin)
                    tail = fh.read(size - begin)
            except OSError:
                continue
            self._sizes[path] = size
            if not self._started:
                continue
            if begin == start + len(head):  # head and tail are one run of whole lines
                lines = (head + tail).split(b"\n")
            else:  # a gap between them: the line cut at each side of it is dropped
                lines = head.split(b"\n")[:-1] + tail.split(b"\n")[1:]
            for line in lines:
                cycle.take(line)
        return cycle


_GATE: list[Gate | None] = []


def _gate() -> Gate | None:
    """The launcher's gate, from the plan its environment names (None: both limits off)."""
    if not _GATE:
        gate = None
        handed = contract.Handed.of()
        if handed.run_dir is not None and handed.plan is not None:
            limits = contract.health_limits(contract.read_plan(handed.plan))
            if limits.no_progress_cycles > 0 or limits.node_fault_limit > 0:
                gate = Gate(handed.run_dir, limits.no_progress_cycles, limits.node_fault_limit, limits.keep_out)
        _GATE.append(gate)
    return _GATE[0]


def before_cycle(agent: Any = None) -> None:
    """The adapters' hook (`agent`: NVRx's agent, whose worker group still holds the ended cycle's ranks):
    stop the launcher (SIGTERM to itself, and its `SignalException` raised here, so no worker of the new
    cycle starts) when restarts made no progress or this node faulted too often."""
    gate = _gate()
    if gate is None:
        return
    verdict = gate.before_cycle(_own_ranks(agent))
    if verdict is None:
        return
    if isinstance(verdict, BadNodeVerdict):
        said = _keep_out(gate, verdict.message())
        record = {"cause": "bad_node", "error": verdict.message() + (f"; {said}" if said else ""),
                  "exit_code": EXIT_FAILURE}
    else:
        record = {"cause": "no_progress", "error": verdict.message(), "exit_code": EXIT_NO_PROGRESS,
                  "best_step": verdict.best, "cycles": verdict.cycles}
    contract.record_fatal(gate.run_dir, record)
    os.kill(os.getpid(), signal.SIGTERM)  # the job's stop, as any other (remembered: no restart after it)
    # During a restart the launcher's handler only remembers the signal, for workers it would start next:
    # raise it here, so that no worker of this cycle starts (one would run into a stop it cannot save at).
    from nvidia_resiliency_ext.fault_tolerance.launcher import SignalException

    raise SignalException(f"Process {os.getpid()} got signal: {int(signal.SIGTERM)}", sigval=signal.SIGTERM)


def _own_ranks(agent: Any) -> list[int]:
    try:
        return [w.global_rank for w in agent._worker_group.workers if w.global_rank is not None]
    except AttributeError:
        return []


def _keep_out(gate: Gate, reason: str) -> str:
    """health.keep_out: this node out of the next placement (and the Slurm job requeued); what was done."""
    from resctl.health import placement

    where = placement.scheduler(os.environ, gate.keep_out)
    if where is None:
        return ""
    node = placement.BadNode(placement.node_name(os.environ), reason)
    said = placement.keep_out(node, where, run_dir=gate.run_dir)
    return said + ("; " + placement.requeue() if where == "slurm" else "")
