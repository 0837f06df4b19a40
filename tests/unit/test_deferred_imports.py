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

PKG = Path(__file__).resolve().parents[2] / "resctl"

#: Modules whose import costs more than THRESHOLD_MS of CPU time in a fresh interpreter (a submodule: on top of
#: the package named after "after"), `python bench/bench_imports.py modules [AFTER:]X`: -X importtime's
#: cumulative time of `import X` and the CPU time (time.process_time) around it, the median of 5 runs (3 for
#: torch and NVRx). Measured 2026-12-06 on the project's 2-core build machine, shared and loaded (load average
#: 10-17: the wall times -X importtime reported were 5-10x the CPU times, hence the threshold on CPU time),
#: Python 3.11.7, torch 2.13.0 CPU, NVRx 0.4.1. A module counts as heavy when it or a package above it is listed.
#: The same table is in docs/architecture.md ("Deferred imports"): re-measure both together.
#: CPU ms, then -X importtime ms in the comment:
HEAVY: dict[str, float] = {
    "torch": 1692.8,                                    # 22475 (torch.distributed, torch.optim, torch.nn,
                                                        # torch.utils.data: 0 after torch)
    "torch.distributed.checkpoint": 884.8,              # 7251, after torch.distributed (.staging: 0 after it)
    "torch.distributed.tensor": 724.4,                  # 8199, after torch.distributed
    "torch.distributed.elastic.rendezvous": 12.2,       # 88, after torch.distributed
    "torch.distributed.elastic.multiprocessing": 10.5,  # 62, after torch.distributed
    "nvidia_resiliency_ext.fault_tolerance": 127.8,     # 417, after torch (nvidia_resiliency_ext: 0.3)
    "nvidia_resiliency_ext.fault_tolerance.launcher": 26.8,  # 116, after nvidia_resiliency_ext.fault_tolerance
    "nvidia_resiliency_ext.inprocess": 160.4,           # 687, after torch
    "nvidia_resiliency_ext.shared_utils.health_check": 6.2,  # 25, after torch (which loads asyncio)
    "rich.console": 44.7,                               # 376
    "rich.text": 26.8,                                  # 201
    "rich.table": 7.4,                                  # 59, after rich.console
    "rich.progress": 16.2,                              # 94, after rich.console
    "typer": 42.4,                                      # 190 (typer.main: 0 after typer)
    "pydantic": 39.6,                                   # 211
    "plotly": 24.6,                                     # 59
    "plotly.subplots": 79.2,                            # 659, after plotly (plotly.graph_objects: 0.3)
    "prometheus_client": 89.0,                          # 637
    "fsspec": 107.0,                                    # 630
    "pynvml": 25.9,                                     # 237
    "psutil": 23.2,                                     # 188
    "numpy": 88.2,                                      # 1115
    "crc32c": 45.3,                                     # 607
    "setproctitle": 11.7,                               # 92
    "multiprocessing": 10.7,                            # 125 (multiprocessing.context: 0 after it)
    "multiprocessing.connection": 18.9,                 # 217
    "importlib.metadata": 26.1,                         # 38
    "asyncio": 33.3,                                    # 34
    "urllib.request": 22.9,                             # 24
    "http.server": 39.2,                                # 314
    "ssl": 13.7,                                        # 62
    "dataclasses": 11.8,                                # 127
    "inspect": 11.2,                                    # 99
    "ctypes.util": 9.4,                                 # 10
    "tomllib": 9.5,                                     # 86
    "logging": 8.4,                                     # 66
    "subprocess": 8.4,                                  # 9
    "concurrent.futures": 8.8,                          # 10
    "socketserver": 7.8,                                # 8
    "secrets": 7.0,                                     # 62
    "statistics": 5.5,                                  # 6
    "hmac": 5.1,                                        # 40
}
#: Below it (CPU ms): hashlib 4.7, uuid 4.6, ctypes 3.9, traceback 3.8, socket 3.7, platform 2.5, html 2.4,
#: json 2.2, datetime 2.2, pickle 2.0, difflib 1.9, signal 1.2, threading 0.9, shlex 0.9, rich 0.7, mmap,
#: resource, select, struct, fcntl 0.3-0.5; re, pathlib, weakref, atexit, itertools, tempfile, shutil,
#: random, runpy, zlib, typing, ipaddress, importlib.util: loaded before any import of resctl's (0).
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


def modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


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
    """For every resctl module: the HEAVY entries importing it loads (module-level imports, transitively)."""
    memo: dict[str, frozenset[str]] = {}

    def visit(module: str, stack: frozenset[str]) -> frozenset[str]:
        if module not in memo:  # no circles (test_layers), so each module's answer is final; `stack` only guards
            found: set[str] = set()
            for t in parsed[module].eager | parents(module, mods):
                if t not in mods:
                    found |= heavy_keys(t)
                elif t not in stack:
                    found |= visit(t, stack | {t})
            memo[module] = frozenset(found)
        return memo[module]

    return {m: visit(m, frozenset({m})) for m in mods}


def deferred_imports() -> list[Deferred]:
    mods = modules()
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
