"""`resctl run`: torchrun's command line, resolved through a profile into ft_launcher."""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Annotated

import typer

from resctl.cli import torchrun_flags
from resctl.cli.doctor_cmd import preflight_check
from resctl.cli.render import info
from resctl.errors import UsageError
from resctl.profile import contract

EPILOG = (
    "Examples: resctl run --nproc-per-node 2 train.py --epochs 3  |  "
    "resctl run -p examples/profiles/eks-p5.toml --dry-run train.py  |  "
    "resctl run --set heartbeat.timeout=2m --set inprocess.enabled=true train.py"
)

Opt = typer.Option


def run(
    script: Annotated[str, typer.Argument(help="Training script (or module with -m, or program with --no-python).")],
    script_args: Annotated[list[str] | None, typer.Argument(help="Arguments passed to the script.")] = None,
    profile: Annotated[Path | None, Opt("-p", "--profile", help="Profile file (default: ./resctl.toml when present).")] = None,
    set_: Annotated[list[str] | None, Opt("--set", help="Override one key: SECTION.KEY=VALUE (repeatable).")] = None,
    dry_run: Annotated[bool, Opt("--dry-run", help="Print the command, its environment and the source of every setting; start nothing.")] = False,
    preflight: Annotated[bool, Opt("--preflight", help="Run `resctl doctor` first; a failed check starts nothing (exit 1).")] = False,
    verbose: Annotated[bool, Opt("-v", "--verbose", help="Show the launcher's and rank monitors' log on the console (else <run_dir>/launcher.log).")] = False,
    **flags: object,  # torchrun's flags: resctl.cli.torchrun_flags.FLAGS (see __signature__ below)
) -> None:
    """Start SCRIPT on every worker, as torchrun does.

    The workers run under NVRx ft_launcher, with resctl's profile and shim.
    """
    from resctl.launch import execute
    from resctl.launch.plan import Target
    from resctl.profile.load import Layer

    typed = torchrun_flags.given(flags)  # bad values and refused flags: exit 2 before anything starts
    module, no_python = bool(typed.get("module")), bool(typed.get("no_python"))
    flags_layer = Layer("flags")
    flags_layer.values, flags_layer.labels = torchrun_flags.layer(typed)
    if verbose:
        os.environ[contract.VERBOSE] = "1"
    if module and no_python:
        raise UsageError("--module and --no-python cannot be used together (as with torchrun)")
    if not module and not no_python and not Path(script).is_file():
        raise UsageError(f"training script not found: {script} (working directory {os.getcwd()}); "
                         "check the path, or pass -m for a module")
    target = Target(script, tuple(script_args or ()), module=module, no_python=no_python)
    resolved, launch_plan = execute.prepare(profile, flags_layer, set_ or [], target)
    launch_plan.args[:0] = torchrun_flags.launcher_args(typed)  # ft_launcher takes them as they are
    info(resolved.loaded())
    if preflight and not dry_run:
        if not preflight_check(resolved):
            raise typer.Exit(1)
    if dry_run:
        from resctl.cli.dry_run import render

        render(launch_plan)
        return
    if resolved.profile.launch.preflight == "cluster":
        from resctl.cli.doctor_cluster import run_preflight

        stop_code = run_preflight(resolved, launch_plan)
        if stop_code is not None:
            raise typer.Exit(stop_code)
    from resctl.checkpoint.owner import check_free

    # Another live job writes there: CheckpointDirInUse, exit 2 (this job's own rank 0 is no other job).
    check_free(resolved.profile.checkpoint.dir, launch_plan.run_id)
    code = execute.run(launch_plan, on_event=info)
    raise typer.Exit(code)


def _signature() -> inspect.Signature:
    own = [p for p in inspect.signature(run, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    return inspect.Signature([*own, *torchrun_flags.options()])


run.__signature__ = _signature()  # type: ignore[attr-defined]
