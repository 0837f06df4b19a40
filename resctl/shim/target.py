"""What a worker runs: the user's script or module, as `python script.py` / `python -m mod` would.

The script becomes the process's `__main__` module for the rest of its life (not runpy's temporary
one), as under `python script.py`: `__main__.__file__` is the script, `__spec__` is None (a module's
spec with `-m`), `sys.argv[0]` is the path as given, and `sys.path[0]` the script's directory. So
a child started with spawn or forkserver re-imports the script by its path and finds the functions
it defines (`Pool.map`, DataLoader workers, `torch.multiprocessing.spawn`), and an atexit handler
of the script still sees its module. Each run (again after an in-process restart) gets a new module.
"""

from __future__ import annotations

import builtins
import io
import os
import runpy
import sys
import types
import warnings
from dataclasses import dataclass
from importlib.machinery import SourceFileLoader

import resctl


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


def new_main() -> types.ModuleType:
    """A new, empty `__main__` module in `sys.modules` (the shim's own or the launcher's is not the script's)."""
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    return main


def fresh_warning_filters() -> None:
    """The warning filters a new interpreter would start the script with: the shim's imports (torch,
    NVRx) added theirs, and a forked worker has the launcher's, which ignore everything."""
    warnings.filters[:] = list(resctl.STARTUP_WARNING_FILTERS)  # type: ignore[index]  # a list at run time
    warnings._filters_mutated()  # type: ignore[attr-defined]  # every module's __warningregistry__ is stale now


def run_target(target: Target) -> None:
    """Run the target as `__main__` in this interpreter (again, after an in-process restart)."""
    sys.argv = [target.name, *target.args]
    fresh_warning_filters()
    main = new_main()
    if target.module:
        # What `python -m` itself runs: the module's code in the (new) __main__ namespace,
        # sys.argv[0] set to the module's file.
        runpy._run_module_as_main(target.name, alter_argv=True)  # type: ignore[attr-defined]
        return
    script = os.path.abspath(target.name)
    sys.path[0] = os.path.dirname(script)  # as `python script.py` would
    with io.open_code(script) as source:
        code = compile(source.read(), script, "exec")
    main.__dict__.update(__file__=script, __cached__=None, __package__=None, __spec__=None,
                         __loader__=SourceFileLoader("__main__", script), __builtins__=builtins)
    exec(code, main.__dict__)
