"""`resctl tune-interval`: the checkpoint interval that maximises expected goodput.

Measured inputs come from a run directory (`--from-run DIR`: step compute, save stalls, write
times, recovery times, the interval and mode the run used) or from flags; a flag beats the run.
The model (docs/tuning.md, `resctl.tuning.model`) takes Daly's optimum on the time a save blocks
training and, for async saves, never goes below `headroom x write time`: a shorter interval puts
every save into back-pressure, where the next save waits for the previous write.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

EPILOG = (
    "Examples: resctl tune-interval --from-run resctl-runs/abc --mtbf 24h --nodes 16  |  "
    "resctl tune-interval --step-time 2.8s --stall 1s --write-time 275s --restart 17s --mtbf 24h --nodes 2 "
    "--interval 100  |  resctl tune-interval --from-run DIR --mtbf 24h --write-profile prod.toml"
)

Opt = typer.Option


def _duration(name: str, value: Optional[str]) -> Optional[float]:
    from resctl.errors import UsageError
    from resctl.profile.units import parse_duration

    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as err:
        raise UsageError(f"{name}: {err}") from None


def _size(name: str, value: Optional[str]) -> Optional[float]:
    from resctl.errors import UsageError
    from resctl.tuning.inputs import parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as err:
        raise UsageError(f"{name}: {err}") from None


def tune_interval(
    from_run: Annotated[Optional[Path], Opt("--from-run", help="Run directory whose events calibrate the model.")] = None,
    step_time: Annotated[Optional[str], Opt("--step-time", help="Compute time of one optimizer step (e.g. 2.8s, 94ms).")] = None,
    stall: Annotated[Optional[str], Opt("--stall", help="Time one save blocks training, not counting waits for an earlier save (async: staging).")] = None,
    write_time: Annotated[Optional[str], Opt("--write-time", help="Time from staged to durable for one checkpoint (e.g. 275s).")] = None,
    state_size: Annotated[Optional[str], Opt("--state-size", help="Checkpoint size per writer (e.g. 6.44GB); with --write-bw gives the write time.")] = None,
    write_bw: Annotated[Optional[str], Opt("--write-bw", help="Write bandwidth (e.g. 1.3GB/s).")] = None,
    restart: Annotated[Optional[str], Opt("--restart", help="Restart cost: fault to the first step after recovery (e.g. 17s).")] = None,
    mtbf: Annotated[Optional[str], Opt("--mtbf", help="Mean time between failures of ONE node (e.g. 24h); divided by --nodes.")] = None,
    nodes: Annotated[int, Opt("--nodes", min=1, help="Nodes in the job.")] = 1,
    interval: Annotated[Optional[int], Opt("--interval", min=1, help="The interval the job uses now, in steps (default: the run's).")] = None,
    sync: Annotated[Optional[bool], Opt("--sync/--async", help="How the job saves (default: the run's checkpoint.async, else async).")] = None,
    write_slowdown: Annotated[Optional[float], Opt("--write-slowdown", min=1.0, help="Step compute while a background write runs over step compute without one (c_w/c_0; default: measured by --from-run, else 1.0).")] = None,
    headroom: Annotated[float, Opt("--headroom", min=1.0, help="Async: keep the compute between saves >= this x the write time.")] = 1.2,
    as_json: Annotated[bool, Opt("--json", help="One JSON document on stdout.")] = False,
    write_profile: Annotated[Optional[Path], Opt("--write-profile", help="Set [checkpoint] interval_steps in this TOML profile (rest of the file kept).")] = None,
) -> None:
    """Recommend checkpoint.interval_steps from measured step, stall, write and restart times."""
    from resctl.errors import UsageError
    from resctl.tuning.inputs import Inputs, MissingInput, assemble
    from resctl.tuning.model import recommend

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
    if given.mtbf_per_node == 0:
        raise UsageError("--mtbf must be > 0")
    try:
        assembled = assemble(given, calibration)
        rec = recommend(assembled.costs, assembled.current, assembled.mode)
    except MissingInput as err:
        raise UsageError(str(err)) from None
    except ValueError as err:
        raise UsageError(f"cannot model this job: {err}") from None

    wrote = None
    if write_profile is not None:
        from resctl.tuning.profile_edit import ProfileEditError, write_interval

        try:
            wrote = write_interval(write_profile, rec.interval_steps)
        except (ProfileEditError, OSError) as err:
            raise UsageError(f"{write_profile}: cannot update checkpoint.interval_steps: {err}") from None

    if as_json:
        doc: dict[str, Any] = {"recommendation": rec.to_json(), "sources": assembled.sources,
                               "run": str(from_run) if from_run else None,
                               "profile_written": str(write_profile) if wrote else None}
        typer.echo(json.dumps(doc, indent=2))
    else:
        _render(rec, assembled.sources)
    from resctl.cli.render import info

    for warning in rec.warnings:
        info(f"warning: {warning}", style="bold yellow")
    if write_profile is not None:
        info(f"{write_profile}: checkpoint.interval_steps = {rec.interval_steps}" + ("" if wrote else " (already)"))


def _load_run(path: Path) -> Any:
    from resctl.cli.report_cmd import load_analysis

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


def _render(rec: Any, sources: dict[str, str]) -> None:
    from rich.table import Table

    from resctl.cli.render import out_console

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
    out_console.print(inputs)
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
