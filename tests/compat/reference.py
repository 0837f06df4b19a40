"""torchrun's reference runs of the compat cases, kept for a later pytest run of the same tree (`--compat-torchrun`).

CI runs the compat suite in both passes: resctl on NVRx 0.4.1, then on 0.7.0. torchrun's side of each comparison
is the same in both (torchrun imports no NVRx), and launching it again was ~290 of pass 2's ~590 compat seconds on
the 2-core VM. Pass 1 writes its torchrun runs; pass 2 reads them and launches only resctl, so each pass still
compares resctl with a torchrun run of the same scripts, made on the same machine in the same CI run.

The file names what it was made from: the torch version, the Python version and a hash of the compat cases, the
runner and every script. A file of anything else is ignored (and written again), as is any run that did not do what
its case says (torchrun's exit code, no hang): those are launched again. So is every case that prints what the
launching shell's environment holds (`Case.shell_env`: env_names lists the variables by name, and pass 2 sets
PYTHONPATH for NVRx 0.7.0, where pass 1 does not; reused, its torchrun run lacked PYTHONPATH, CI 962ba73). The other
scripts print what the launcher makes or what the interpreter does, the same in both passes: a case that came to
depend on the shell's variables would fail pass 2 visibly (a difference against torchrun), never pass silently,
except where resctl dropped such a variable: that is env_names' subject, launched afresh in each pass.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib import metadata
from pathlib import Path

from tests.compat.cases import Case
from tests.compat.runner import HERE, SCRIPTS, Outcome, recorded, replayed

TORCHRUN = "torchrun"


def fingerprint() -> str:
    """What torchrun's runs of these cases depend on here: torch, Python, the cases, the runner, the scripts."""
    digest = hashlib.sha256(f"torch {metadata.version('torch')} python {sys.version}".encode())
    files = [(HERE, HERE / "cases.py"), (HERE, HERE / "runner.py")]
    files += [(SCRIPTS, p) for p in sorted(SCRIPTS.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
    for root, path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def read(path: Path, cases: dict[str, Case]) -> dict[str, Outcome]:
    """The torchrun runs `path` holds for this tree, by case name (only those that did what the case says)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("fingerprint") != fingerprint():
        return {}
    found = {}
    for name, o in (data.get("runs") or {}).items():
        case = cases.get(name)
        if case is not None and not case.shell_env and o["code"] == case.code and not o["hang"]:
            found[name] = replayed(TORCHRUN, o)
    return found


def write(path: Path, runs: dict[str, Outcome]) -> None:
    """torchrun's runs by case name, with this tree's fingerprint (atomically: a reader sees all or nothing)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"fingerprint": fingerprint(), "runs": {name: recorded(o) for name, o in runs.items()}}))
    tmp.replace(path)
