"""`python -m resctl.launch.ft_entry ARGS`: NVRx `ft_launcher` with resctl's adapters applied.

resctl starts the launcher through this module instead of `-m nvidia_resiliency_ext...launcher` so
that gaps between an NVRx release and the installed torch, and the launcher's slow paths, can be
bridged without forking NVRx.

What is patched, and why, is in `resctl.launch.adapters`; what is imported ahead of forked workers in
`resctl.launch.preload`; where the launcher's logs go in `resctl.launch.launcher_logs`. This module
only puts them in order and runs the launcher.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import signal
import sys
from collections.abc import Callable

from resctl.launch import adapters, launcher_logs, lifeline, preload, prestart, stop
from resctl.launch.titles import set_title
from resctl.profile import contract


def _launcher_title() -> str:
    try:
        with open(os.environ[contract.PLAN], encoding="utf-8") as f:
            return "resctl-launcher " + os.path.basename(json.load(f)["target"]["script"])
    except (KeyError, OSError, ValueError, TypeError):
        return "resctl-launcher"


def main() -> None:
    with preload.collector_off(freeze=True):  # torch, NVRx, the shim: the launcher's for good
        launcher_main = _prepare()
    try:
        launcher_main()
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    lifeline.exit_quickly(adapters.launcher_exit_code(code))


def _prepare() -> Callable[[], object]:
    """Everything before NVRx's launcher runs, in order; its `main`."""
    # First: a `resctl run` SIGKILLed from here on still stops the job (a SIGTERM: its final save).
    lifeline.die_with_parent(signal.SIGTERM, lifeline.expected(os.environ, lifeline.RUN_PID_ENV))
    os.environ[lifeline.LAUNCHER_PID_ENV] = str(os.getpid())  # exec'd workers set theirs (resctl.shim)
    early = sys.argv[1:] == [prestart.AWAIT]  # started before the plan was made (resctl.launch.prestart)
    if early:
        prestart.listen()
    if os.environ.get(contract.PRELOAD) == "1":
        preload.import_torch()  # before anything imports it: what it warns, forked workers show again
    started_early = None
    if early:
        import resctl.profile.schema  # noqa: F401  # deferred: the shim's, imported while `resctl run` still works

        started_early = prestart.receive()
    launcher_logs.quiet_logs()  # before NVRx is imported: its logging set-up at import then does nothing
    preload.ImportWarnings.replay()  # and the launcher's log keeps them
    refuse_unknown_nvrx()

    marker = stop.file_for(os.getpid())
    os.environ[stop.ENV] = str(marker)
    atexit.register(stop.remove, marker)
    adapters.apply_adapters()
    adapters.install_fork_hook(os.getpid())
    launcher_logs.install()  # no secrets or stop tracebacks in its log
    if started_early:
        logging.getLogger(__name__).info(started_early)
    if os.environ.get(contract.PRELOAD) == "1":
        preload.preload()
    set_title(_launcher_title())
    # deferred: after quiet_logs() and the adapters above: NVRx sets its logging up when imported
    from nvidia_resiliency_ext.fault_tolerance.launcher import main as launcher_main

    return launcher_main


def refuse_unknown_nvrx() -> None:
    """Exit 2 before NVRx's launcher starts anything when resctl cannot drive the installed NVRx (a
    version out of range, or one that lacks a private name resctl's agent uses): a message, no
    traceback mid-job. `resctl run` refuses versions out of range itself, before it starts this."""
    from importlib import metadata

    from resctl.launch.nvrx_private import refusal

    try:
        version = metadata.version("nvidia-resiliency-ext")
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    why = refusal(version)
    if why is not None:
        sys.stderr.write(f"resctl: {why}\n")
        sys.stderr.flush()
        os._exit(2)


if __name__ == "__main__":
    main()
