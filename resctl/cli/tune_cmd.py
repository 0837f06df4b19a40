"""`resctl tune-interval`: the checkpoint intervals that maximise expected goodput.

Measured inputs come from a run directory (`--from-run DIR`: step compute, save stalls, write
times, recovery times, memory snapshot stalls and commits, the intervals and mode the run used) or
from flags; a flag beats the run. The model (docs/tuning.md, `resctl.tuning.model`) takes Daly's
optimum on the time a save blocks training and, for async saves, never goes below
`headroom x write time`: a shorter interval puts every save into back-pressure, where the next save
waits for the previous write.

With memory-tier numbers (a run with `checkpoint.memory_every > 0`, or `--mem-stall` and
`--mem-commit`) it plans two tiers (`resctl.tuning.two_tier`): `memory_every` from the snapshot's
copy against faults the node survives, `interval_steps` from the disk write against node faults,
a multiple of `memory_every`, both within `--max-overhead`. Without them it plans the disk alone
and says why.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from resctl.cli.render import info, out_console
from resctl.cli.report_cmd import load_analysis
from resctl.errors import UsageError
from resctl.profile.units import parse_duration

if TYPE_CHECKING:  # the CLI imports its library lazily (`--help` stays fast)
    from resctl.telemetry.goodput import RunAnalysis
    from resctl.tuning.advise import Advice
    from resctl.tuning.inputs import MemoryAssembled
    from resctl.tuning.model import Recommendation
    from resctl.tuning.two_tier import TwoTierPlan

EPILOG = (
    "Examples: resctl tune-interval --from-run resctl-runs/abc --mtbf 24h --nodes 16  |  "
    "resctl tune-interval --step-time 2.8s --stall 1s --write-time 275s --restart 17s --mtbf 24h --nodes 2 "
    "--interval 100  |  resctl tune-interval --from-run DIR --mtbf 24h --write-profile prod.toml  |  "
    "resctl tune-interval --from-run DIR --mtbf 24h --node-mtbf 30d --nodes 16 --max-overhead 1% --toml"
)

Opt = typer.Option


def _duration(name: str, value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as err:
        raise UsageError(f"{name}: {err}") from None


def _size(name: str, value: str | None) -> float | None:
    from resctl.tuning.inputs import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as err:
        raise UsageError(f"{name}: {err}") from None


def _fraction(name: str, value: str) -> float:
    """0.01 from `1%` or `0.01`; UsageError unless strictly between 0 and 1."""
    text = value.strip()
    try:
        number = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        number = math.nan
    if not 0.0 < number < 1.0:
        raise UsageError(f"{name} {value!r}: give the overhead allowed as a percentage or fraction between 0 and 1 "
                         "(e.g. 1% or 0.01)")
    return number


def tune_interval(
    from_run: Annotated[Path | None, Opt("--from-run", help="Run directory whose events calibrate the model.")] = None,
    step_time: Annotated[str | None, Opt("--step-time", help="Compute time of one optimizer step (e.g. 2.8s, 94ms).")] = None,
    stall: Annotated[str | None, Opt("--stall", help="Time one save blocks training, not counting waits for an earlier save (async: staging).")] = None,
    write_time: Annotated[str | None, Opt("--write-time", help="Time from staged to durable for one checkpoint (e.g. 275s).")] = None,
    state_size: Annotated[str | None, Opt("--state-size", help="Checkpoint size per writer (e.g. 6.44GB); with --write-bw gives the write time.")] = None,
    write_bw: Annotated[str | None, Opt("--write-bw", help="Write bandwidth (e.g. 1.3GB/s).")] = None,
    restart: Annotated[str | None, Opt("--restart", help="Restart cost: fault to the first step after recovery (e.g. 17s).")] = None,
    mtbf: Annotated[str | None, Opt("--mtbf", help="Mean time between failures of ONE node (e.g. 24h); divided by --nodes.")] = None,
    nodes: Annotated[int, Opt("--nodes", min=1, help="Nodes in the job.")] = 1,
    interval: Annotated[int | None, Opt("--interval", min=1, help="The interval the job uses now, in steps (default: the run's).")] = None,
    sync: Annotated[bool | None, Opt("--sync/--async", help="How the job saves (default: the run's checkpoint.async, else async).")] = None,
    write_slowdown: Annotated[float | None, Opt("--write-slowdown", min=1.0, help="Step compute while a background write runs over step compute without one (c_w/c_0; default: measured by --from-run, else 1.0).")] = None,
    headroom: Annotated[float, Opt("--headroom", min=1.0, help="Async: keep the compute between saves >= this x the write time.")] = 1.2,
    mem_stall: Annotated[str | None, Opt("--mem-stall", help="Time one memory snapshot blocks training (the copy out of the state; default: the run's ckpt_mem).")] = None,
    mem_commit: Annotated[str | None, Opt("--mem-commit", help="Background commit of one memory snapshot: checksum, manifest (stage=device: also the device-to-host copy).")] = None,
    memory_every: Annotated[int | None, Opt("--memory-every", min=1, help="The memory_every the job uses now (default: the run's).")] = None,
    node_mtbf: Annotated[str | None, Opt("--node-mtbf", help="Mean time between faults that lose a node's memory, of ONE node (>= --mtbf); default: every fault may.")] = None,
    max_overhead: Annotated[str, Opt("--max-overhead", help="Two tiers: fault-free overhead allowed for both tiers together (e.g. 1%).")] = "1%",
    as_json: Annotated[bool, Opt("--json", help="One JSON document on stdout.")] = False,
    as_toml: Annotated[bool, Opt("--toml", help="Print the plan as a profile's [checkpoint] section on stdout.")] = False,
    write_profile: Annotated[Path | None, Opt("--write-profile", help="Set [checkpoint] interval_steps (and memory_every with two tiers) in this TOML profile (rest of the file kept).")] = None,
) -> None:
    """Recommend a checkpoint interval for a job.

    checkpoint.interval_steps (and memory_every) from measured step, stall, write, snapshot and restart times.
    """
    from resctl.tuning.advise import advise
    from resctl.tuning.inputs import Inputs, MemoryInputs, MissingInput

    if as_json and as_toml:
        raise UsageError("--json and --toml both print on stdout: give one")
    budget = _fraction("--max-overhead", max_overhead)

    calibration = None
    if from_run is not None:
        calibration = _load_run(from_run).calibration
    given = Inputs(
        step_time=_duration("--step-time", step_time), stall=_duration("--stall", stall),
        write_time=_duration("--write-time", write_time), state_size=_size("--state-size", state_size),
        write_bw=_size("--write-bw", write_bw), restart=_duration("--restart", restart),
        mtbf_per_node=_duration("--mtbf", mtbf), nodes=nodes, interval=interval,
        mode=None if sync is None else ("sync" if sync else "async"), headroom=headroom,
        write_slowdown=write_slowdown,
    )
    if given.step_time == 0:
        raise UsageError("--step-time must be > 0")
    given_mem = MemoryInputs(stall=_duration("--mem-stall", mem_stall), commit=_duration("--mem-commit", mem_commit),
                             memory_every=memory_every, node_mtbf_per_node=_duration("--node-mtbf", node_mtbf))
    for flag, value in (("--mtbf", given.mtbf_per_node), ("--node-mtbf", given_mem.node_mtbf_per_node)):
        if value == 0:
            raise UsageError(f"{flag} must be > 0 (a mean time between failures, e.g. 24h)")
    try:
        advice = advise(given, given_mem, calibration, budget)
    except MissingInput as err:
        raise UsageError(str(err)) from None
    except ValueError as err:
        raise UsageError(f"cannot model this job: {err}") from None
    _show(advice, as_json, as_toml, from_run, write_profile)


def _show(advice: Advice, as_json: bool, as_toml: bool, from_run: Path | None, write_profile: Path | None) -> None:
    """Write the profile when asked, then render the advice (stdout: data; stderr: talk)."""
    values, two, mem, rec, why_not = advice.values, advice.two_tier, advice.memory, advice.recommendation, advice.skipped
    wrote = None
    if write_profile is not None:
        from resctl.tuning.profile_edit import ProfileEditError, write_keys

        try:
            wrote = write_keys(write_profile, values)
        except (ProfileEditError, OSError) as err:
            raise UsageError(f"{write_profile}: cannot update {', '.join('checkpoint.' + k for k in values)}: {err}") from None

    if as_json:
        doc: dict[str, Any] = {**advice.to_json(), "run": str(from_run) if from_run else None,
                               "profile_written": str(write_profile) if wrote else None}
        typer.echo(json.dumps(doc, indent=2))
    elif as_toml:
        typer.echo(_toml(values, two, why_not), nl=False)
    elif two is not None and mem is not None:
        _render_inputs(rec, advice.sources, mem)
        _render_two(two, rec, mem, advice.current)
    else:
        _render(rec, advice.assembled.sources)
    if why_not and not as_json:
        info(f"memory tier not planned: {why_not}", style="yellow")
    for warning in advice.warnings:
        info(f"warning: {warning}", style="bold yellow")
    if write_profile is not None:
        info(f"{write_profile}: " + ", ".join(f"checkpoint.{k} = {v}" for k, v in values.items())
             + ("" if wrote else " (already)"))


def _toml(values: dict[str, int], two: TwoTierPlan | None, why_not: str | None) -> str:
    if two is None:
        head = f"# resctl tune-interval: disk checkpoints only ({why_not})"
    else:
        head = (f"# resctl tune-interval: memory snapshot every {two.memory_every} steps, disk every "
                f"{two.interval_steps}; overhead {two.overhead:.2%} (budget {two.max_overhead:.2%})")
    return "\n".join([head, "[checkpoint]", *(f"{k} = {v}" for k, v in values.items())]) + "\n"


def _load_run(path: Path) -> RunAnalysis:
    return load_analysis(path)


def _secs(value: float) -> str:
    if math.isinf(value):
        return "inf"
    if value >= 3600:
        return f"{value / 3600:.3g}h"
    if value >= 60:
        return f"{value / 60:.3g}m"
    if value >= 1:
        return f"{value:.3g}s"
    return f"{value * 1000:.3g}ms"


def _render_inputs(rec: Recommendation, sources: dict[str, str], mem: MemoryAssembled | None = None) -> None:
    from rich.table import Table


    c = rec.costs
    inputs = Table("input", "value", "source", title="inputs")
    for label, value, key in (
        ("step compute", _secs(c.step_time), "step_time"), ("save stall", _secs(c.stall), "stall"),
        ("checkpoint write", _secs(c.write), "write"), ("write slowdown", f"{c.write_slowdown:.3g}x", "write_slowdown"),
        ("restart cost", _secs(c.restart), "restart"),
        ("job MTBF", _secs(c.mtbf), "mtbf"), ("mode", rec.mode, "mode"),
        ("current interval", f"{rec.current.interval_steps} steps" if rec.current else "-", "interval"),
    ):
        inputs.add_row(label, value, sources.get(key, "-"))
    if mem is not None:
        for label, value, key in (
            ("memory snapshot stall", _secs(mem.memory.stall), "mem_stall"),
            ("memory snapshot commit", _secs(mem.memory.commit), "mem_commit"),
            ("current memory_every", f"{mem.current} steps" if mem.current else "-", "memory_every"),
            ("MTBF, process faults", _secs(mem.process_mtbf), "process_mtbf"),
            ("MTBF, node faults", _secs(mem.node_mtbf), "node_mtbf"),
        ):
            inputs.add_row(label, value, sources.get(key, "-"))
    out_console.print(inputs)


_MEMORY_WHY = {
    "daly": "Daly optimum on the {stall} snapshot stall against process faults every {mp}",
    "commit": "compute between snapshots >= {h:g} x the {commit} commit, so no snapshot waits for the last",
    "budget": "lengthened to keep the overhead within {budget}",
    "disk-source": "no process faults: one snapshot per disk write, as its source",
}
_DISK_WHY = {
    "daly": "single-tier optimum against node faults every {mn} (Daly)",
    "back-pressure": "single-tier optimum against node faults every {mn} (back-pressure floor)",
    "multiple": "single-tier optimum against node faults every {mn} ({n0}), rounded up to a multiple of memory_every",
    "budget": "lengthened to keep the overhead within {budget}",
    "mtbf": "capped at the node MTBF",
}


def _render_two(two: TwoTierPlan, rec: Recommendation, mem: MemoryAssembled, now: TwoTierPlan | str | None) -> None:
    t = rec.costs.step_time
    words = dict(stall=_secs(mem.memory.stall), commit=_secs(mem.memory.commit), mp=_secs(mem.process_mtbf),
                 mn=_secs(mem.node_mtbf), h=rec.costs.headroom, budget=f"{two.max_overhead:.2%}", n0=two.disk_only_interval)
    lines = [
        "recommended (two tiers):",
        f"  checkpoint.memory_every = {two.memory_every}  ({_secs(two.memory_every * t)} of compute; "
        f"{_MEMORY_WHY[two.memory_rule].format(**words)})",
        f"  checkpoint.interval_steps = {two.interval_steps}  ({_secs(two.interval_steps * t)} of compute; "
        f"{_DISK_WHY[two.disk_rule].format(**words)})",
        f"  expected overhead {two.overhead:.2%} (memory snapshots {two.overhead_memory:.2%}), "
        f"{'within' if two.feasible else 'OVER'} the {two.max_overhead:.2%} budget",
        f"  work lost per process fault (restored from memory): {two.steps_lost_process:.1f} steps "
        f"({_secs(two.loss_process_s)} of compute)",
        f"  work lost per node fault (restored from disk): {two.steps_lost_node:.1f} steps ({_secs(two.loss_node_s)})",
        f"  MTBF assumed: {mem.assumption}",
    ]
    if isinstance(now, str):
        lines.append(f"current: {now}")
    elif now is not None:
        lines.append(f"current (memory_every = {now.memory_every}, interval_steps = {now.interval_steps}): overhead "
                     f"{now.overhead:.2%}, {now.steps_lost_process:.1f} steps lost per process fault, "
                     f"{now.steps_lost_node:.1f} per node fault")
    p = rec.prediction
    lines.append(f"one tier (memory_every = 0): checkpoint.interval_steps = {rec.interval_steps}, efficiency "
                 f"{p.efficiency:.2%}, {p.steps_lost:.1f} steps lost per fault")
    out_console.print("\n".join(lines))


def _render(rec: Recommendation, sources: dict[str, str]) -> None:
    from rich.table import Table


    c = rec.costs
    _render_inputs(rec, sources)
    p = rec.prediction
    why = (f"Daly optimum on the {_secs(rec.costs.blocking(rec.mode))} blocking cost" if rec.bound == "daly" else
           f"back-pressure floor: {c.headroom:g} x {_secs(c.write)} write at {c.write_slowdown:.3g}x slower steps (Daly alone: {_secs(rec.daly_compute_s)})")
    out_console.print(
        f"recommended: checkpoint.interval_steps = {rec.interval_steps}  ({rec.mode}; {_secs(p.compute_s)} of compute "
        f"between saves; {why})\n"
        f"  predicted efficiency {p.efficiency:.2%}   expected goodput {p.goodput:.2%}   "
        f"work lost per failure {p.steps_lost:.1f} steps ({_secs(p.work_lost_s)} of compute; "
        f"{_secs(p.wasted_per_failure_s)} wasted with the restart)"
    )
    table = Table("", "steps", "mode", "compute", "effic.", "lost", "goodput", "regime",
                  title="alternatives (compute between saves; steps lost per failure)")
    for alt in rec.alternatives:
        q = alt.prediction
        table.add_row(alt.label, f"{q.interval_steps}", q.mode, _secs(q.compute_s), f"{q.efficiency:.2%}",
                      f"{q.steps_lost:.1f}", f"{q.goodput:.2%}", q.regime)
    out_console.print(table)
