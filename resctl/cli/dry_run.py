"""`resctl run --dry-run`: the exact command, the environment added, and where each setting came from."""

from __future__ import annotations

import shlex

from resctl.cli.render import out_console
from resctl.launch.execute import launcher_program
from resctl.launch.plan import LaunchPlan
from resctl.redact import redact_argv, redact_text, redact_value


def render(launch_plan: LaunchPlan) -> None:
    out_console.print("# command", markup=False)
    out_console.print(shlex.join(redact_argv(launch_plan.command(launcher_program()))), markup=False)
    out_console.print("\n# environment added", markup=False)
    for name, value in sorted(launch_plan.env.items()):
        out_console.print(f"{name}={shlex.quote(redact_value(name, value))}", markup=False)
    out_console.print("\n# files written before launch", markup=False)
    for path in launch_plan.files:
        out_console.print(str(path), markup=False)
    out_console.print(f"\n# where each setting came from (NVRx {launch_plan.nvrx_version}, series {launch_plan.nvrx_series})",
                      markup=False)
    settings = [(flag, " ".join(redact_argv([flag, value])[1:]), source) for flag, value, source in launch_plan.settings]
    width = max(len(f"{flag} {value}") for flag, value, _ in settings)
    for flag, value, source in settings:
        out_console.print(f"{flag} {value}".ljust(width) + f"  <- {source}", markup=False)
    for note in launch_plan.notes:
        out_console.print(f"note: {redact_text(note)}", markup=False)
