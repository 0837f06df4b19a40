"""`resctl run --dry-run`: the exact command, the environment added, and where each setting came from."""

from __future__ import annotations

import shlex

from resctl.cli.render import out_console
from resctl.launch.execute import launcher_program
from resctl.launch.plan import LaunchPlan
from resctl.redact import redact_argv, redact_text, redact_value


def _print(text: str) -> None:
    # Arguments and paths may carry undecodable bytes (lone surrogates from argv): show them escaped.
    out_console.print(text.encode("utf-8", "backslashreplace").decode("utf-8"), markup=False)


def render(launch_plan: LaunchPlan) -> None:
    _print("# command")
    _print(shlex.join(redact_argv(launch_plan.command(launcher_program()))))
    _print("\n# environment added")
    for name, value in sorted(launch_plan.env.items()):
        _print(f"{name}={shlex.quote(redact_value(name, value))}")
    _print("\n# what a run creates before launch (a dry run creates nothing)")
    for directory in launch_plan.dirs:
        _print(f"{directory}/")
    for path in launch_plan.files:
        _print(str(path))
    _print(f"\n# where each setting came from (NVRx {launch_plan.nvrx_version}, series {launch_plan.nvrx_series})")
    settings = [(flag, " ".join(redact_argv([flag, value])[1:]), source) for flag, value, source in launch_plan.settings]
    width = max(len(f"{flag} {value}") for flag, value, _ in settings)
    for flag, value, source in settings:
        _print(f"{flag} {value}".ljust(width) + f"  <- {source}")
    for note in launch_plan.notes:
        _print(f"note: {redact_text(note)}")
    _print("\n# recovery layers")
    for layer in launch_plan.layers:
        _print(layer)
