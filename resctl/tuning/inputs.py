"""Assemble the model's `Costs` from a run's calibration and explicit numbers, with provenance.

Precedence per quantity: an explicit number (a flag) beats what the run measured; where neither
exists the restart cost is taken as 0 (it only scales the goodput, not the interval) and a
missing MTBF is an error (without a failure rate there is no optimum). Every quantity records
where it came from, and `tune-interval` prints that next to it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from resctl.telemetry.goodput import Calibration
from resctl.tuning.model import DEFAULT_HEADROOM, Costs, Mode
from resctl.tuning.two_tier import MemoryCosts

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([kKmMgGtT]i?)?[bB]?\s*(/\s*s)?\s*$")
_FACTORS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}


def parse_size(text: str) -> float:
    """Bytes from `6.44GB`, `512MiB`, `1e9`, `1.3GB/s` (a rate reads the same). Raises ValueError."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size; use bytes or a unit: 512MB, 6.44GB, 2GiB (rates: 1.3GB/s)")
    value = float(match.group(1)) * _FACTORS[(match.group(2) or "").lower()]
    if value <= 0:
        raise ValueError(f"{text!r}: must be > 0")
    return value


@dataclass
class Inputs:
    """Explicit numbers from the command line (None: not given). Seconds and bytes."""

    step_time: float | None = None
    stall: float | None = None
    write_time: float | None = None
    state_size: float | None = None
    write_bw: float | None = None
    restart: float | None = None
    mtbf_per_node: float | None = None
    nodes: int = 1
    interval: int | None = None
    mode: Mode | None = None
    headroom: float = DEFAULT_HEADROOM
    write_slowdown: float | None = None  # c_w / c_0 (the CLI's --write-slowdown)


@dataclass
class Assembled:
    costs: Costs
    current: int | None
    mode: Mode
    sources: dict[str, str] = field(default_factory=dict)


class MissingInput(ValueError):
    """A quantity the model needs is neither measured nor given (the message names the flag)."""


def assemble(given: Inputs, run: Calibration | None) -> Assembled:
    """Costs for the model: flags first, then the run's measurements (see the module docstring)."""
    src: dict[str, str] = {}
    run_async = run.async_ if run else None
    mode: Mode = given.mode or ("sync" if run_async is False else "async")
    src["mode"] = "--sync/--async" if given.mode else "default" if run_async is None else (
        "run: the script's own torch.save blocks (checkpoint.async applies to resctl.checkpoint)"
        if run and run.async_source == "torch.save" else "run (plan.json: checkpoint.async)")

    def pick(name: str, flag: float | None, measured: float | None, flag_name: str, what: str) -> float:
        if flag is not None:
            src[name] = flag_name
            return flag
        if measured is not None:
            src[name] = what
            return measured
        raise MissingInput(f"no {name.replace('_', ' ')}: give {flag_name}" + (" or --from-run DIR" if run is None else
                           f" (the run has no {what.split(':', 1)[-1].strip()})"))

    # With a measured slowdown the model's step time is c_0 (no write running); the plain mean
    # mixes c_0 and c_w in whatever proportion the calibration interval had.
    idle = run is not None and run.step_time_idle is not None and run.write_slowdown is not None
    step = pick("step_time", given.step_time,
                (run.step_time_idle if idle else run.step_time if run.step_samples else None) if run else None,
                "--step-time", (f"run: mean of {run.idle_samples} steps with no write running" if idle and run else
                                f"run: mean of {run.step_samples if run else 0} steps"))
    if given.write_slowdown is not None:
        slowdown, src["write_slowdown"] = given.write_slowdown, "--write-slowdown"
    elif idle and run is not None and run.write_slowdown is not None:
        slowdown = max(1.0, run.write_slowdown)
        src["write_slowdown"] = (f"run: c_w / c_0 = {run.write_slowdown:.3f} over {run.writing_samples} steps "
                                 f"overlapping a write and {run.idle_samples} not"
                                 + (" (below 1: noise, taken as 1.0)" if run.write_slowdown < 1.0 else ""))
    else:
        slowdown = 1.0
        src["write_slowdown"] = "not measured, taken as 1.0 (give --write-slowdown)"
    write_flag = given.write_time
    write_label = "--write-time"
    if write_flag is None and given.state_size is not None:
        if given.write_bw is None:
            raise MissingInput("--state-size needs --write-bw (e.g. --state-size 6.44GB --write-bw 1.3GB/s)")
        write_flag = given.state_size / given.write_bw
        write_label = "--state-size / --write-bw"
    elif given.write_bw is not None and given.state_size is None and write_flag is None:
        if run is None or not run.write_bytes:
            raise MissingInput("--write-bw needs --state-size (or a run whose checkpoints recorded their bytes)")
        write_flag = run.write_bytes / given.write_bw
        write_label = "run bytes / --write-bw"
    write = pick("write", write_flag, run.write if run else None, write_label,
                 f"run: mean of {run.saves if run else 0} checkpoint writes")
    measured_stall = run.stall if run else None
    if measured_stall is not None and run_async is False and run and run.write is not None:
        measured_stall = max(0.0, measured_stall - run.write)  # a sync save's stall contains its write
    stall = pick("stall", given.stall, measured_stall, "--stall", f"run: mean of {run.saves if run else 0} save stalls")

    if given.restart is not None:
        restart, src["restart"] = given.restart, "--restart"
    elif run is not None and run.restart is not None:
        restart, src["restart"] = run.restart, "run: mean fault-to-first-step"
    else:
        restart, src["restart"] = 0.0, "not measured, taken as 0 (give --restart)"

    if given.mtbf_per_node is not None:
        mtbf = given.mtbf_per_node / max(1, given.nodes)
        src["mtbf"] = f"--mtbf / --nodes {given.nodes}"
    elif run is not None and run.unplanned_faults > 0:
        mtbf = run.wall_s / run.unplanned_faults
        src["mtbf"] = f"run: {run.unplanned_faults} unplanned fault(s) in {run.wall_s:.0f} s"
    else:
        raise MissingInput("no failure rate: give --mtbf (per node) and --nodes, e.g. --mtbf 24h --nodes 16"
                           + ("" if run is None else "; the run had no unplanned faults to measure it from"))

    if given.interval is not None:
        current: int | None = given.interval
        src["interval"] = "--interval"
    elif run is not None and run.interval_steps is not None:
        current = run.interval_steps
        src["interval"] = "run"
    else:
        current = None
    if not math.isfinite(mtbf):
        raise MissingInput("the MTBF must be finite")
    costs = Costs(step_time=step, stall=stall, write=write, restart=restart, mtbf=mtbf, headroom=given.headroom,
                  write_slowdown=slowdown)
    return Assembled(costs, current, mode, src)


@dataclass
class MemoryInputs:
    """Explicit memory-tier numbers from the command line (None: not given). Seconds."""

    stall: float | None = None  # --mem-stall
    commit: float | None = None  # --mem-commit
    memory_every: int | None = None  # --memory-every: what the job uses now
    node_mtbf_per_node: float | None = None  # --node-mtbf


@dataclass
class MemoryAssembled:
    memory: MemoryCosts
    process_mtbf: float  # job level; inf: every fault loses the node
    node_mtbf: float  # job level
    current: int | None  # memory_every the job uses now
    assumption: str  # the MTBF split, in words
    sources: dict[str, str] = field(default_factory=dict)


def assemble_memory(given: MemoryInputs, run: Calibration | None, disk: Assembled,
                    nodes: int = 1) -> MemoryAssembled | str:
    """The memory tier's inputs, or why it cannot be planned (a sentence for the user). Raises
    `MissingInput` for a number that is given half (a stall without a commit) or is not usable."""
    src: dict[str, str] = {}
    measured = run is not None and run.mem_snapshots > 0
    if given.stall is None and not measured:
        if run is not None:
            return ("the run has no memory-tier snapshots (no ckpt_mem events: checkpoint.memory_every was 0 or the "
                    "tier was off); calibrate with a run at memory_every = 1, or give --mem-stall and --mem-commit")
        return "no memory-tier numbers: give --mem-stall and --mem-commit, or --from-run a run with memory_every > 0"
    if given.stall is not None:
        stall, src["mem_stall"] = given.stall, "--mem-stall"
    else:
        assert run is not None and run.mem_stall is not None
        stall, src["mem_stall"] = run.mem_stall, f"run: mean of {run.mem_snapshots} ckpt_mem (seconds - waited)"
    if given.commit is not None:
        commit, src["mem_commit"] = given.commit, "--mem-commit"
    elif measured and run is not None and run.mem_commit is not None:
        commit, src["mem_commit"] = run.mem_commit, "run: mean ckpt_mem commit"
    else:
        raise MissingInput("no memory snapshot commit time: give --mem-commit (the background checksum and manifest "
                           "of one snapshot; with stage = device also its device-to-host copy)")
    try:
        memory = MemoryCosts(stall, commit)
    except ValueError as err:
        raise MissingInput(f"{err} (mem_stall from {src['mem_stall']}, mem_commit from {src['mem_commit']}); "
                           "give --mem-stall and --mem-commit") from None

    mtbf = disk.costs.mtbf
    if given.node_mtbf_per_node is not None:
        node = given.node_mtbf_per_node / max(1, nodes)
        if node < mtbf * (1 - 1e-9):
            raise MissingInput(f"--node-mtbf ({given.node_mtbf_per_node:g} s per node) is shorter than the MTBF of all "
                               f"faults ({mtbf * max(1, nodes):g} s per node): node losses are some of the faults; "
                               "give a --node-mtbf at least --mtbf")
        process = math.inf if node <= mtbf * (1 + 1e-9) else 1.0 / (1.0 / mtbf - 1.0 / node)
        src["node_mtbf"] = f"--node-mtbf / --nodes {nodes}"
        src["process_mtbf"] = f"1 / (1/MTBF - 1/node MTBF), MTBF from {disk.sources.get('mtbf', '-')}"
        assumption = (f"a node lost every {_hours(node)}, other faults (the node survives) every "
                      + ("- (none)" if math.isinf(process) else _hours(process)) + ", for the whole job")
    else:
        node = process = mtbf
        src["node_mtbf"] = src["process_mtbf"] = f"the job MTBF ({disk.sources.get('mtbf', '-')}), both: worst case"
        assumption = (f"any fault (one every {_hours(mtbf)} for the whole job) may lose the node (disk interval) or only "
                      "the process (memory interval): each tier planned for its worst case; give --node-mtbf to split them")
    if given.memory_every is not None:
        current: int | None = given.memory_every
        src["memory_every"] = "--memory-every"
    elif run is not None and run.memory_every is not None:
        current, src["memory_every"] = run.memory_every, "run"
    else:
        current = None
    return MemoryAssembled(memory, process, node, current, assumption, src)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.3g} h" if seconds >= 3600 else f"{seconds:.3g} s"
