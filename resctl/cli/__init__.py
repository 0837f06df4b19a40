"""resctl's command line. The only place that prints and picks exit codes.

Library code raises typed errors (`resctl.errors`); `main()` renders them: a message, exit
code 2 for usage/profile errors, 1 for failures, and a traceback only with RESCTL_DEBUG=1.
Heavy modules (torch, NVRx) are imported inside the commands that need them, so
`resctl --help` stays fast.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import typer
import typer.core
import typer.main

from resctl import __version__
from resctl.cli import doctor_cmd, profile_cmd, report_cmd, run_cmd, store_cmd, tune_cmd
from resctl.cli.render import error
from resctl.cli.torchrun_flags import BY_DEST, help_text
from resctl.errors import EXIT_FAILURE, EXIT_USAGE, ResctlError
from resctl.profile import contract

app = typer.Typer(
    name="resctl",
    help="Fault-tolerant PyTorch launcher: torchrun's flags, NVRx ft_launcher underneath, a TOML profile on top.",
    epilog="Example: resctl run --nproc-per-node 8 -p prod.toml train.py --lr 3e-4",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"resctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """resctl: keep the GPUs training when a rank fails."""


app.command(
    "run",
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},  # as torchrun
    epilog=run_cmd.EPILOG,
)(run_cmd.run)
app.add_typer(profile_cmd.app, name="profile")
app.command("doctor", epilog=doctor_cmd.EPILOG)(doctor_cmd.doctor)
app.command("tune-interval", epilog=tune_cmd.EPILOG)(tune_cmd.tune_interval)
app.command("report", epilog=report_cmd.EPILOG)(report_cmd.report)
app.command("store", epilog=store_cmd.EPILOG)(store_cmd.store)


#: Metavars where the option's name upper-cased (argparse's and so torchrun's way) says less.
METAVARS = {"set_": "KEY=VALUE", "profile": "FILE"}


@functools.cache
def command() -> Any:
    """The click command of `app`, its help showing what a value is (`--nnodes NNODES`,
    `--set KEY=VALUE`), as torchrun's does, instead of Python types (`<list[str]>`). Built once a process
    (typer reads every command's signature and evaluates its annotations: ~45 ms); click makes a new
    context for each invocation, so the command is only read after it is built."""
    root: Any = typer.main.get_command(app)  # a TyperGroup: it has .commands

    def walk(cmd: Any) -> None:
        for param in cmd.params:
            if isinstance(param, typer.core.TyperArgument):
                param.display_type_rich = lambda ctx: None  # type: ignore[method-assign]  # SCRIPT, not SCRIPT <str>
                param.metavar = param.metavar or (param.name or "").upper()
            elif param.metavar is None and not getattr(param, "is_flag", False):
                name = param.name or ""
                param.metavar = METAVARS.get(name, name.rstrip("_").upper())
        for sub in getattr(cmd, "commands", {}).values():
            walk(sub)

    walk(root)
    _defaults_in_help(root.commands["run"])
    return root


def _defaults_in_help(run: Any) -> None:
    """`resctl run --help` states each profile flag's key and default, read from the schema when
    the page is shown: other commands (and `resctl --help`) do not import the schema."""
    format_help = run.format_help

    def with_defaults(ctx: Any, formatter: Any) -> None:
        for param in run.params:
            if param.name in BY_DEST:
                param.help = help_text(BY_DEST[param.name])
        format_help(ctx, formatter)

    run.format_help = with_defaults


INTERNAL = "internal error (a bug in resctl):"


def main() -> None:
    debug = os.environ.get(contract.DEBUG) == "1"
    try:
        command()(prog_name="resctl")
    except ResctlError as err:
        if debug:
            raise
        error(str(err))
        sys.exit(err.exit_code if err.exit_code else EXIT_USAGE)
    except KeyboardInterrupt:
        if debug:
            raise
        sys.exit(130)  # 128 + SIGINT, as a shell reports it
    except Exception as err:  # a bug in resctl: say so in one line; the traceback is for RESCTL_DEBUG=1
        if debug:
            raise
        error(f"{INTERNAL} {type(err).__name__}: {err}. Run again with RESCTL_DEBUG=1 for the traceback, "
              "and report it with the command line used.")
        sys.exit(EXIT_FAILURE)
