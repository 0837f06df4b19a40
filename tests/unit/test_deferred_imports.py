"""An import inside a function (a deferred import) only where it buys start-up time, and says so (issue 44).

Read from the source (ast, no timing, milliseconds). An import inside a function is allowed when

(a) what it imports is on `HEAVY` (measured below), or imports one of them at its own module level,
    transitively through resctl's modules, and the importing module does not already import that at
    its own module level (transitively too): the deferral keeps something heavy out of a process; or
(b) its statement carries `# deferred: <reason>` (on its first line or the line above it), for a reason
    the rule cannot see: fork-safety, an import that must run late (after a preload, in the forked
    worker), an optional package. "A circle" is never a reason: tests/unit/test_layers.py forbids them.

Every other import goes to the top of its module. docs/architecture.md ("Deferred imports") has the table.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from tests.unit.test_layers import _modules

PKG = Path(__file__).resolve().parents[2] / "resctl"

#: Modules whose import takes more than THRESHOLD_MS in a fresh interpreter (a submodule: on top of the package
#: named after "after"), `python bench/bench_imports.py modules [AFTER:]X`: -X importtime's cumulative time of
#: `import X`, the median of 5 runs (3 for torch and NVRx), and in the comment the CPU time (time.process_time)
#: around the same import. Measured 2026-12-06 on the project's 2-core build machine (shared; load average 3-5
#: then: the wall times were within 10 % of the CPU times; at load 10-17 they were 5-10x), Python 3.11.7,
#: torch 2.13.0 CPU, NVRx 0.4.1. A module counts as heavy when it or a package above it is listed. The same
#: table is in docs/architecture.md ("Deferred imports"): re-measure both together. ms (CPU ms):
HEAVY: dict[str, float] = {
    "torch": 1234.5,                                    # 1171 (torch.distributed, .optim, .nn: 0 after torch)
    "torch.distributed.checkpoint": 712.6,              # 666, after torch.distributed (.staging: 0 after it)
    "torch.distributed.tensor": 803.5,                  # 747, after torch.distributed
    "torch.distributed.elastic.rendezvous": 12.4,       # 12, after torch.distributed
    "torch.distributed.elastic.multiprocessing": 7.9,   # 8, after torch.distributed
    "nvidia_resiliency_ext.fault_tolerance": 116.8,     # 117, after torch (the package alone: 0.2)
    "nvidia_resiliency_ext.fault_tolerance.launcher": 19.9,  # 20, after nvidia_resiliency_ext.fault_tolerance
    "nvidia_resiliency_ext.inprocess": 241.2,           # 137, after torch
    "nvidia_resiliency_ext.shared_utils.health_check": 10.7,  # 6.5, after torch (it imports asyncio)
    "rich.console": 43.9,                               # 38.6 (rich alone: 0.7)
    "rich.text": 21.3,                                  # 20.1
    "rich.table": 5.4,                                  # 5.3, after rich.console
    "rich.progress": 8.8,                               # 8.5, after rich.console
    "typer": 36.7,                                      # 34.2 (typer.main: 0 after typer)
    "pydantic": 32.2,                                   # 30.6
    "plotly": 20.0,                                     # 19.3 (plotly.graph_objects: 0.3 after plotly)
    "plotly.subplots": 49.6,                            # 47.0, after plotly
    "prometheus_client": 44.8,                          # 42.0
    "fsspec": 62.7,                                     # 56.4
    "pynvml": 16.4,                                     # 15.3
    "psutil": 18.4,                                     # 17.8
    "numpy": 113.0,                                     # 107.9
    "crc32c": 21.4,                                     # 20.5
    "setproctitle": 6.6,                                # 6.4
    "multiprocessing": 8.1,                             # 7.8 (multiprocessing.context: 0 after it)
    "multiprocessing.connection": 11.8,                 # 11.3
    "importlib.metadata": 17.8,                         # 17.0
    "asyncio": 38.0,                                    # 35.6
    "urllib.request": 23.6,                             # 21.8
    "http.server": 22.1,                                # 21.5
    "ssl": 9.3,                                         # 9.1
    "ctypes.util": 7.0,                                 # 6.8
    "logging": 7.0,                                     # 6.6
    "concurrent.futures": 6.8,                          # 6.6
    "dataclasses": 6.6,                                 # 6.4
    "inspect": 6.4,                                     # 6.3
    # resctl's own modules that the CLI's commands import when they run, on top of `resctl.cli` (what every
    # `resctl ...`, --help included, loads); the same runs, load average 4 (so importtime ~2x the CPU time):
    "resctl.cli.doctor_cluster": 11.7,                  # 10.6
    "resctl.cli.report_ranks": 55.6,                    # 23.4
    "resctl.telemetry.events": 31.1,                    # 13.0
    "resctl.telemetry.goodput": 66.6,                   # 30.4
    "resctl.telemetry.ranks": 12.0,                     # 4.9
    "resctl.telemetry.report_rows": 65.2,               # 24.4
    "resctl.telemetry.report_html": 59.6,               # 25.2
    "resctl.launch.store_server": 9.9,                  # 4.3
    "resctl.tuning.inputs": 77.0,                       # 40.4
    "resctl.tuning.advise": 71.2,                       # 38.6
    "resctl.tuning.profile_edit": 13.1,                 # 6.6
}
#: Below it: tomllib 4.8, subprocess 4.8, socketserver 4.7, secrets 4.1, socket 4.0, statistics 3.6, hmac 3.2,
#: hashlib 3.0, traceback 2.6, uuid 2.4, datetime 2.2, pickle 2.1, ctypes 2.0, json 1.8, platform 1.7, html 1.6;
#: signal, threading, shlex, difflib, struct, fcntl, mmap, select, resource < 1.5; re, pathlib, weakref,
#: atexit, itertools, tempfile, shutil, random, runpy, zlib, typing, ipaddress, importlib.util: loaded before
#: any import of resctl's (0).
THRESHOLD_MS = 5.0

#: What a heavy module imports at its own module level that is heavy too (read from -X importtime): a
#: module that imports NVRx's fault_tolerance at its top has torch already.
IMPLIES: dict[str, frozenset[str]] = {
    "nvidia_resiliency_ext.fault_tolerance": frozenset({"torch", "numpy", "pynvml", "psutil"}),
    "nvidia_resiliency_ext.inprocess": frozenset({"torch"}),
    "nvidia_resiliency_ext.shared_utils.health_check": frozenset({"asyncio", "logging"}),
    "rich.table": frozenset({"rich.text"}),
    "typer": frozenset({"inspect"}),
    "pydantic": frozenset({"inspect", "dataclasses"}),
}

#: Deferred imports that do not follow the rule yet, as "path:line" strings. A test fails when one of
#: them is fixed, so the entry is removed with the fix: the list only shrinks.
ALLOWED: frozenset[str] = frozenset()

COMMENT = re.compile(r"#\s*deferred:\s*(?P<reason>.*\S)")
NOT_A_REASON = re.compile(r"circ|cycl|loop of imports", re.IGNORECASE)


@dataclass(frozen=True)
class Deferred:
    path: str
    line: int
    target: str
    heavy: frozenset[str]
    comment: str | None


def heavy_keys(module: str) -> frozenset[str]:
    """The HEAVY entries that importing `module` loads: it and every package above it, then what they imply."""
    parts = module.split(".")
    above = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    found = above & HEAVY.keys()
    for key in above:
        found |= IMPLIES.get(key, frozenset())
    return frozenset(found)


def targets(node: ast.Import | ast.ImportFrom, package: str, mods: dict[str, Path]) -> set[str]:
    """The modules an import statement loads."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    # `from pkg import sub`: the submodule where it is one of resctl's or a heavy one (`from nvidia_resiliency_ext
    # import inprocess`), else the module the names come from
    return {f"{base}.{a.name}" if f"{base}.{a.name}" in mods or heavy_keys(f"{base}.{a.name}") - heavy_keys(base)
            else base for a in node.names}


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


@dataclass
class Parsed:
    eager: set[str]  # modules imported at module level (run at import time)
    deferred: list[tuple[int, int, str]]  # (first line, last line, target) of each import inside a function


def parse(name: str, path: Path, mods: dict[str, Path]) -> Parsed:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = Parsed(set(), [])

    def walk(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if _is_type_checking(child):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for t in targets(child, package, mods):
                    if inside:
                        out.deferred.append((child.lineno, child.end_lineno or child.lineno, t))
                    else:
                        out.eager.add(t)
            walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return out


def parents(module: str, mods: dict[str, Path]) -> set[str]:
    """The packages Python imports before `module` (their __init__)."""
    parts = module.split(".")
    return {p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in mods}


def closure_heavy(mods: dict[str, Path], parsed: dict[str, Parsed]) -> dict[str, frozenset[str]]:
    """For every resctl module: the HEAVY entries importing it loads (module-level imports and the packages
    above it, transitively). Walked from each module afresh: a package and the submodules its __init__ imports
    reach each other, so no answer can be kept from a walk that started elsewhere."""
    out = {}
    for module in mods:
        seen, todo, found = {module}, [module], set()
        while todo:
            here = todo.pop()
            for t in parsed[here].eager | parents(here, mods):
                if t not in mods:
                    found |= heavy_keys(t)
                elif t not in seen:
                    seen.add(t)
                    todo.append(t)
        out[module] = frozenset(found)
    return out


def deferred_imports() -> list[Deferred]:
    mods = _modules()  # the layer test's map of resctl's modules to their files
    parsed = {name: parse(name, path, mods) for name, path in mods.items()}
    heavy_of = closure_heavy(mods, parsed)
    found = []
    for name, path in sorted(mods.items()):
        lines = path.read_text(encoding="utf-8").splitlines()
        for first, last, target in parsed[name].deferred:
            pulled = (heavy_of[target] | heavy_keys(target)) if target in mods else heavy_keys(target)
            comment = None
            for text in [lines[first - 2] if first > 1 else "", *lines[first - 1:last]]:
                if m := COMMENT.search(text):
                    comment = m.group("reason")
            found.append(Deferred(path.relative_to(PKG.parent).as_posix(), first, target,
                                  frozenset(pulled - heavy_of[name]), comment))
    return found


def verdict(d: Deferred) -> str | None:
    """None where the deferred import follows the rule, else what to do."""
    if d.comment is not None:
        if NOT_A_REASON.search(d.comment):
            return f"`# deferred: {d.comment}` is no reason (no circles: test_layers); import {d.target} at the top"
        if len(d.comment.split()) < 3:
            return f"`# deferred: {d.comment}`: say why in a few words (what it keeps out, or must run after)"
        return None
    if d.heavy:
        return None
    return (f"import {d.target} at the top of the module: it loads nothing heavy the module does not have "
            f"already (or say why with `# deferred: <reason>`)")


def test_every_deferred_import_is_justified() -> None:
    bad = {}
    for d in deferred_imports():
        why = verdict(d)
        if why and f"{d.path}:{d.line}" not in ALLOWED:
            bad[f"{d.path}:{d.line}"] = why
    assert bad == {}, "\n".join(f"{k}: {v}" for k, v in bad.items())


def test_the_allowlist_only_shrinks() -> None:
    still = {f"{d.path}:{d.line}" for d in deferred_imports() if verdict(d)}
    assert sorted(ALLOWED - still) == [], "these follow the rule now (or moved): remove them from ALLOWED"


def test_the_rule_sees_heavy_light_and_comments(tmp_path: Path) -> None:
    """A light deferred import is refused; a heavy one, or one with a reason, passes; a circle is no reason."""
    assert heavy_keys("torch.distributed.checkpoint") >= {"torch"}
    assert heavy_keys("json") == frozenset()
    light = Deferred("m.py", 3, "json", frozenset(), None)
    assert verdict(light) is not None and "import json at the top" in (verdict(light) or "")
    assert verdict(Deferred("m.py", 3, "torch", frozenset({"torch"}), None)) is None
    assert verdict(Deferred("m.py", 3, "json", frozenset(), "runs in the forked worker after the preload")) is None
    assert verdict(Deferred("m.py", 3, "resctl.x", frozenset(), "a module-level import would form a circle"))
    module = tmp_path / "x.py"
    module.write_text("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                      "def f():\n    import json\n", encoding="utf-8")
    parsed = parse("resctl.x", module, {"resctl.x": module})
    assert parsed.eager == {"os", "typing"} and parsed.deferred == [(6, 6, "json")]


def test_a_deferred_import_of_what_the_module_has_already_buys_nothing(tmp_path: Path) -> None:
    """A module that imports torch at its top (itself or through a resctl module) gains nothing by deferring it."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import torch\n", encoding="utf-8")
    b.write_text("from resctl import a\ndef f():\n    import torch.distributed\n", encoding="utf-8")
    mods = {"resctl.a": a, "resctl.b": b}
    parsed = {"resctl.a": parse("resctl.a", a, mods), "resctl.b": parse("resctl.b", b, mods)}
    heavy = closure_heavy(mods, parsed)
    if "torch" in HEAVY:
        assert heavy["resctl.a"] >= {"torch"} and heavy["resctl.b"] >= {"torch"}


def test_the_heavy_list_is_what_was_measured_above_the_threshold() -> None:
    assert {m: ms for m, ms in HEAVY.items() if ms <= THRESHOLD_MS} == {}
    assert set(IMPLIES) <= set(HEAVY) and all(v <= set(HEAVY) for v in IMPLIES.values())
