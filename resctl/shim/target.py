"""What a worker runs: the user's script or module, as `python script.py` / `python -m mod` would."""

from __future__ import annotations

import os
import runpy
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    name: str
    args: list[str]
    module: bool


def parse_argv(argv: list[str]) -> Target:
    module = False
    if argv and argv[0] == "--resctl-module":
        module, argv = True, argv[1:]
    if not argv:
        raise SystemExit("usage: python -m resctl.shim [--resctl-module] SCRIPT [ARGS...]")
    return Target(argv[0], argv[1:], module)


def run_target(target: Target) -> None:
    """Run the target as `__main__` in this interpreter (again, after an in-process restart)."""
    sys.argv = [target.name, *target.args]
    if target.module:
        runpy.run_module(target.name, run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(target.name)
        sys.path[0] = os.path.dirname(script)  # as `python script.py` would
        runpy.run_path(script, run_name="__main__")
