"""The one place that starts the launcher.

resctl runs ft_launcher as a child rather than exec'ing it, so that it can forward signals
(SIGTERM/SIGINT/SIGUSR1/SIGUSR2) to the launcher's process group leader, pass its exit code
through, and print a one-screen summary of what failed when it fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

from resctl.errors import LaunchError
from resctl.launch import rendezvous
from resctl.launch.plan import LAUNCHER_ENTRY, LaunchPlan, Target, plan
from resctl.profile.load import Layer, Resolved, resolve

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def installed_nvrx() -> str:
    try:
        return metadata.version("nvidia-resiliency-ext")
    except metadata.PackageNotFoundError:
        raise LaunchError(
            "nvidia-resiliency-ext is not installed in this Python; install it with "
            "`pip install nvidia-resiliency-ext` (0.4.1 on glibc < 2.39)"
        ) from None


def prepare(profile: Path | None, flags: Layer, sets: Sequence[str], target: Target) -> tuple[Resolved, LaunchPlan]:
    """Resolve the profile, find the rendezvous and plan the launcher command."""
    resolved = resolve(profile, flags=flags, sets=sets)
    launch = resolved.profile.launch
    version = installed_nvrx() if launch.nvrx_version == "auto" else launch.nvrx_version
    rdzv = rendezvous.detect(launch, os.environ, socket.gethostname())
    return resolved, plan(resolved, target, rdzv, version, user_env=os.environ, cwd=Path.cwd())


def launcher_program() -> list[str]:
    # The same interpreter as resctl, so the workers see the same packages; ft_entry runs NVRx's
    # launcher after the version adapters it needs.
    return [sys.executable, "-m", LAUNCHER_ENTRY]


def write_files(launch_plan: LaunchPlan) -> None:
    # Every node of a job writes the same files into a shared run directory (FSx): the temporary
    # name is per process so two nodes never rename each other's file away.
    for directory in launch_plan.dirs:
        directory.mkdir(parents=True, exist_ok=True)
    for path, text in launch_plan.files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp.{socket.gethostname()}.{os.getpid()}")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)


def run(launch_plan: LaunchPlan, on_event: Callable[[str], None] = print) -> int:
    """Start ft_launcher, forward signals, return its exit code (printing a summary on failure)."""
    write_files(launch_plan)
    for note in launch_plan.notes:
        on_event(f"resctl: {note}")
    on_event(f"resctl: run {launch_plan.run_id} -> {launch_plan.run_dir}")
    if launch_plan.metrics_port is not None:
        import json

        from resctl.launch.plan import PLAN_FILE
        from resctl.telemetry.metrics import serve

        plan_data = json.loads(launch_plan.files[launch_plan.run_dir / PLAN_FILE])
        serve(launch_plan.run_dir, launch_plan.metrics_port, plan=plan_data)
        on_event(f"resctl: metrics on :{launch_plan.metrics_port}/metrics")
    env = {**os.environ, **launch_plan.env}
    received: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: object) -> None:
        received.append(signum)
        for child in started:
            try:
                child.send_signal(signum)
            except ProcessLookupError:
                pass

    # Handlers go in before the launcher starts: a signal in between must not orphan it.
    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        child = subprocess.Popen(launcher_program() + launch_plan.args, env=env)
        started.append(child)
        for signum in received:  # arrived while the launcher was starting
            child.send_signal(signum)
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    from resctl.checkpoint import memdir

    memdir.release_job(launch_plan.run_id)  # backstop: memory-tier snapshots this node's workers left
    if code < 0:  # the launcher itself died of a signal: report it the way a shell would
        code = 128 - code
    if code != 0 and received:
        names = ", ".join(sorted({signal.Signals(s).name for s in received}))
        on_event(f"resctl: stopped by {names} (forwarded to ft_launcher); exit {code}; run dir {launch_plan.run_dir}")
    elif code != 0:
        from resctl.telemetry.summary import failure_summary

        for line in failure_summary(launch_plan.run_dir, code):
            on_event(line)
    return code
