"""The package's import graph and the size of its rooms: no circles, no import climbing back up the
layers, no circle between packages, no module over `MAX_MODULE_LINES`, no class over `MAX_CLASS_LINES`.

Read from the source (ast), so it costs milliseconds and sees every import: module-level,
inside functions (deferred) and under TYPE_CHECKING. Circles between modules are looked for among all
of them: a deferred import hides a circle from the interpreter, not from the design (nor does a
TYPE_CHECKING block); so are circles between packages, and layers.
docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "resctl"

#: Lowest first. A module may import its own layer and the layers below it. The first layer holds
#: facts every layer uses (errors, the fault-drill registry, the slot policy, ...): they import
#: nothing of resctl but each other.
LAYERS: list[tuple[str, ...]] = [
    ("resctl", "resctl.errors", "resctl.console", "resctl.drills", "resctl.patching", "resctl.redact", "resctl.profile.units",
     "resctl.slots"),
    ("resctl.profile",),
    ("resctl.telemetry",),
    ("resctl.checkpoint",),
    ("resctl.tuning",),
    ("resctl.launch", "resctl.health"),
    ("resctl.shim",),
    ("resctl.doctor",),
    ("resctl.cli", "resctl.__main__"),
]


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> tuple[set[str], set[str]]:
    """(imports run at import time, all imports) of one module, as module names of the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    eager: set[str] = set()
    every: set[str] = set()

    def targets(node: ast.Import | ast.ImportFrom) -> set[str]:
        found = set()
        if isinstance(node, ast.Import):
            found = {a.name for a in node.names}
        else:
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base)
        return {t for t in found if t in mods and t != name}

    def walk(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                hit = targets(child)
                every.update(hit)
                if not deferred:
                    eager.update(hit)
            walk(child, deferred or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(ast.parse(path.read_text(encoding="utf-8")), False)
    return eager, every


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    mods = _modules()
    eager, every = {}, {}
    for name, path in mods.items():
        eager[name], every[name] = _imports(name, path, mods)
    return eager, every


def layer_of(module: str) -> int:
    best, where = -1, -1
    for i, members in enumerate(LAYERS):
        for m in members:
            if (module == m or module.startswith(m + ".")) and len(m) > best:
                best, where = len(m), i
    return where


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer() -> None:
    _, every = _graph()
    assert [m for m in sorted(every) if layer_of(m) < 0] == []


def test_no_import_circles() -> None:
    eager, every = _graph()
    assert cycles(eager) == []
    assert cycles(every) == [], "deferred (function-level) imports count: move the shared name below both"


def test_deferred_imports_count_for_circles(tmp_path: Path) -> None:
    """An import inside a function is an edge of the graph the circle check reads."""
    module = tmp_path / "x.py"
    module.write_text("def f():\n    from resctl import y\n", encoding="utf-8")
    eager, every = _imports("resctl.x", module, {"resctl.x": module, "resctl.y": tmp_path / "y.py"})
    assert (eager, every) == (set(), {"resctl.y"})
    assert cycles({"resctl.x": every, "resctl.y": {"resctl.x"}}) == [["resctl.x", "resctl.y"]]


def test_no_import_climbs_a_layer() -> None:
    _, every = _graph()
    climbing = [f"{m} -> {t}" for m, targets in sorted(every.items()) for t in sorted(targets)
                if layer_of(t) > layer_of(m)]
    assert climbing == []


def test_facts_import_only_facts() -> None:
    _, every = _graph()
    facts = [m for m in every if layer_of(m) == 0]
    assert {m: sorted(t for t in every[m] if layer_of(t) != 0) for m in facts if any(layer_of(t) != 0 for t in every[m])} == {}


MAX_MODULE_LINES = 700
MAX_CLASS_LINES = 450
#: Rooms over the limits while their owner's change lands, each with why. A test fails when one of
#: them is back within its limit, so the entry is removed with the fix.
OVERSIZE: dict[str, str] = {}


def package_of(module: str) -> str:
    """The package a module belongs to: `resctl.launch.plan` -> `resctl.launch`; a top-level module
    (`resctl.errors`, `resctl.__main__`) is a room of its own."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        here = package_of(module)
        out.setdefault(here, set()).update(package_of(t) for t in targets if package_of(t) != here)
    for targets in list(out.values()):
        for t in targets:
            out.setdefault(t, set())
    return out


def test_no_circle_between_packages() -> None:
    _, every = _graph()
    assert cycles(package_graph(every)) == []


def _rel(path: Path) -> str:
    return path.relative_to(PKG.parent).as_posix()


def test_no_module_over_the_limit() -> None:
    sizes = {_rel(p): len(p.read_text(encoding="utf-8").splitlines()) for p in PKG.rglob("*.py")}
    assert {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES and m not in OVERSIZE} == {}
    assert [m for m in OVERSIZE if sizes.get(m, 0) <= MAX_MODULE_LINES] == [], "remove them from OVERSIZE"


def test_no_class_over_the_limit() -> None:
    big = {}
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and (n := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES:
                big[f"{_rel(path)}:{node.name}"] = n
    assert big == {}


def test_the_check_sees_a_circle_and_a_climb() -> None:
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]
    assert layer_of("resctl.profile.load") < layer_of("resctl.shim.faults")
    assert package_graph({"resctl.a.x": {"resctl.b.y"}, "resctl.b.y": {"resctl.a.z"}, "resctl.a.z": set()}) == {
        "resctl.a": {"resctl.b"}, "resctl.b": {"resctl.a"}}
    assert package_of("resctl.errors") == "resctl.errors" and package_of("resctl.launch") == "resctl.launch"


def test_the_architecture_map_names_every_module() -> None:
    text = (PKG.parent / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        shown = "resctl/__init__.py" if rel == "__init__.py" else rel
        if not re.search(r"(?<![\w.])" + re.escape(shown) + r"(?!\w)", text):
            missing.append(rel)
    assert missing == [], "add these modules to docs/architecture.md's map"
