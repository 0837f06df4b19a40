"""`resctl profile show|init|validate`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from resctl.cli.render import info, out_console
from resctl.errors import ProfileError, UsageError
from resctl.redact import redact_env, redact_rdzv_conf, redact_text

app = typer.Typer(help="Inspect, create and check resctl profiles.", no_args_is_help=True, rich_markup_mode=None)

ProfileOpt = Annotated[
    Path | None, typer.Option("-p", "--profile", help="Profile file (default: ./resctl.toml when present).")
]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override one key: SECTION.KEY=VALUE (repeatable).")]


@app.command("show", epilog="Example: resctl profile show -p examples/profiles/eks-p5.toml --set launch.max_restarts=5")
def show(
    profile: ProfileOpt = None,
    set_: SetOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Print the resolved profile and where every value came from."""
    from rich.table import Table

    from resctl.profile.load import resolve
    from resctl.profile.render import show_value
    from resctl.profile.schema import keys

    resolved = resolve(profile, sets=set_ or [])
    info(resolved.loaded())
    # Secrets stay off the screen: strings by their shape, launch.env by name and shape, rdzv_conf values
    # unless known harmless.
    dumped = resolved.profile.model_dump(mode="json", by_alias=True)
    for values in dumped.values():
        values.update({key: redact_text(v) for key, v in values.items() if isinstance(v, str)})
    dumped["launch"]["env"] = redact_env(dumped["launch"]["env"])
    dumped["launch"]["rdzv_conf"] = redact_rdzv_conf(dumped["launch"]["rdzv_conf"])
    if as_json:
        typer.echo(json.dumps({"file": str(resolved.file) if resolved.file else None, "profile": dumped,
                               "sources": {k: resolved.source(k) for k in keys()}}, indent=2))
        return
    table = Table("key", "value", "source", title=f"profile: {resolved.file or 'built-in defaults'}")
    for dotted, (section, fld) in keys().items():
        value = getattr(getattr(resolved.profile, section), fld)
        if isinstance(value, str) or dotted in ("launch.env", "launch.rdzv_conf"):  # numbers hold no secrets
            value = dumped[section][dotted.split(".", 1)[1]]
        table.add_row(dotted, show_value(section, fld, value), resolved.source(dotted))
    out_console.print(table)


@app.command("init", epilog="Example: resctl profile init resctl.toml")
def init(
    path: Annotated[Path, typer.Argument(help="Where to write the starter profile.")] = Path("resctl.toml"),
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing file.")] = False,
) -> None:
    """Write a commented starter profile with every key at its default."""
    from resctl.profile.render import starter_toml

    if path.exists() and not force:
        raise UsageError(f"{path} exists; pass --force to overwrite it or give another path")
    path.write_text(starter_toml(), encoding="utf-8")
    info(f"wrote {path}")


@app.command("validate", epilog="Example: resctl profile validate examples/profiles/eks-p5.toml")
def validate(path: Annotated[Path, typer.Argument(help="Profile file to check.")]) -> None:
    """Check a profile file as `resctl run` would.

    Every rule `resctl run` applies (no environment or flags), and that its grace periods nest;
    exit 2 with every problem.
    """
    from resctl.launch.execute import nvrx_version
    from resctl.profile import grace
    from resctl.profile.load import resolve

    try:
        resolved = resolve(path, use_env=False)
    except ProfileError as err:  # every problem in one pass: the grace rules too, on the keys that are valid
        if err.partial is None:
            raise
        raise ProfileError(err.problems + grace.problems(err.partial, str(path))) from None  # type: ignore[arg-type]
    nvrx_version(resolved)  # the launcher's own rules (restart policy of the NVRx version), as `run` checks them
    problems = grace.problems(resolved.profile, str(path))
    if problems:
        raise ProfileError(problems)
    info(f"{path}: ok")
