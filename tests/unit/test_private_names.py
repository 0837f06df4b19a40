"""Every private name of torch or NVRx in resctl's source is listed in `resctl.launch.nvrx_private` (where a
test checks it on each supported release and the launcher refuses a release that lacks one).

Read from the source (ast). What counts as a private name of torch or NVRx:
- a path through a name imported from `torch` or `nvidia_resiliency_ext` (in the scope that imports it):
  `torch._dynamo`, `dist.distributed_c10d._get_default_store`, `from ..._ft_rendezvous import ...`, and
  such a path written as a string (`sys.modules.get("torch.distributed.tensor._random")`): listed when an
  entry's path is it or lies under it;
- a method of a class that subclasses a torch/NVRx class, whose base has that private name (a seam);
- `obj._name` (or `getattr(obj, "_name")`, `patches.set(obj, "_name", ...)`) on any other object, when resctl
  itself defines no `_name` (no method, class or module attribute, no `self._name = ...`, no `_resctl_` tag):
  then the object is someone else's, and the name must be listed (by name).
Objects of the standard library reached through its modules (`os._exit`, `sys._getframe`) are not torch's.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

from resctl.launch import nvrx_private

PKG = Path(__file__).resolve().parents[2] / "resctl"
FOREIGN = ("torch", "nvidia_resiliency_ext")
#: Underscore names that are the standard library's public API (namedtuple's).
PUBLIC_UNDERSCORE = {"_fields", "_replace", "_asdict", "_make"}
ATTR_CALLS = {"getattr", "hasattr", "setattr", "delattr", "set"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _foreign(dotted: str) -> bool:
    return dotted.split(".", 1)[0] in FOREIGN


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PKG.rglob("*.py"))}


def _own_names(trees: dict[Path, ast.Module]) -> set[str]:
    """The private names resctl defines: what it defines at module or class level, assigns on self/cls."""
    own: set[str] = set()
    for tree in trees.values():
        bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        for body in bodies:
            for node in body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    own.add(node.name)
                for target in _targets(node):
                    if isinstance(target, ast.Name):
                        own.add(target.id)
        for every in ast.walk(tree):
            for target in _targets(every):
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                        target.value.id in ("self", "cls"):
                    own.add(target.attr)
    return own


def _unpacked(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _unpacked(element)
    elif isinstance(target, ast.Starred):
        yield from _unpacked(target.value)
    else:
        yield target


def _targets(node: ast.AST) -> Iterator[ast.expr]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _unpacked(target)
    elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        yield node.target


class _Scan(ast.NodeVisitor):
    """The private torch/NVRx names of one module: (line, path or None, name)."""

    def __init__(self, own: set[str]) -> None:
        self.own = own
        self.scopes: list[dict[str, str | None]] = [{}]  # name -> dotted foreign path (None: other import)
        self.found: list[tuple[int, str | None, str]] = []

    # -- scopes ---------------------------------------------------------------------------------
    def _bind_imports(self, body: list[ast.stmt]) -> dict[str, str | None]:
        bound: dict[str, str | None] = {}
        for node in body:
            for sub in [node, *_shallow(node)]:
                if isinstance(sub, ast.Import):
                    for a in sub.names:
                        name = a.asname or a.name.split(".", 1)[0]
                        full = a.name if a.asname else a.name.split(".", 1)[0]
                        bound[name] = full if _foreign(full) else (None if not full.startswith("resctl") else "")
                elif isinstance(sub, ast.ImportFrom) and sub.module and not sub.level:
                    for a in sub.names:
                        full = f"{sub.module}.{a.name}"
                        bound[a.asname or a.name] = full if _foreign(full) else (
                            None if not full.startswith("resctl") else "")
                else:
                    for target, value in _assigned(sub):
                        if isinstance(target, ast.Name):
                            module = _module_lookup(value)  # `sys.modules.get("x")` stands for module x
                            bound.setdefault(target.id, "" if module is None else
                                             module if _foreign(module) else None)  # else a local: shadows
        return bound

    def _lookup(self, name: str) -> str | None | bool:
        """The foreign path a name stands for; None for a standard-library import; False otherwise."""
        for scope in reversed(self.scopes):
            if name in scope:
                value = scope[name]
                return False if value == "" else value
        return False

    def visit_Module(self, node: ast.Module) -> None:
        self.scopes = [self._bind_imports(node.body)]
        self.generic_visit(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        local = self._bind_imports(node.body)
        for arg in [*node.args.args, *node.args.kwonlyargs, *node.args.posonlyargs]:
            local.setdefault(arg.arg, "")
        self.scopes.append(local)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    # -- findings -------------------------------------------------------------------------------
    def _path(self, line: int, dotted: str) -> None:
        parts = dotted.split(".")
        for i, part in enumerate(parts):
            if _private(part):
                self.found.append((line, ".".join(parts[: i + 1]), part))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and _foreign(node.module):
            for a in node.names:
                self._path(node.lineno, f"{node.module}.{a.name}")

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if _foreign(a.name):
                self._path(node.lineno, a.name)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, str) and _foreign(value) and all(p.isidentifier() for p in value.split(".")):
            self._path(node.lineno, value)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain, root = [node.attr], node.value
        while isinstance(root, ast.Attribute):
            chain.append(root.attr)
            root = root.value
        if isinstance(root, ast.Name):
            where = self._lookup(root.id)
            if isinstance(where, str):
                self._path(node.lineno, ".".join([where, *reversed(chain)]))
                return  # the whole chain is read here
            if where is None:
                return  # the standard library's
        self._name(node.lineno, node.attr)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if called in ATTR_CALLS and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
                isinstance(node.args[1].value, str):
            holder = node.args[0]
            where = self._dotted(holder) if isinstance(holder, (ast.Name, ast.Attribute)) else False
            if isinstance(where, str):
                self._path(node.lineno, f"{where}.{node.args[1].value}")
            elif where is not None:
                self._name(node.lineno, node.args[1].value)
        self.generic_visit(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        bases = [b for b in (self._dotted(base) for base in node.bases) if isinstance(b, str)]
        for base in bases:
            klass = _import(base)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(item.name) and \
                        klass is not None and hasattr(klass, item.name):
                    self.found.append((item.lineno, f"{base}.{item.name}", item.name))
        self.generic_visit(node)

    def _dotted(self, node: ast.expr) -> str | None | bool:
        """The foreign path an expression names; None for the standard library's; False otherwise."""
        chain: list[str] = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        where = self._lookup(node.id) if isinstance(node, ast.Name) else False
        return ".".join([where, *reversed(chain)]) if isinstance(where, str) else where

    def _name(self, line: int, name: str) -> None:
        if _private(name) and name not in self.own and not name.startswith("_resctl") and \
                name not in PUBLIC_UNDERSCORE:
            self.found.append((line, None, name))


def _assigned(node: ast.AST) -> Iterator[tuple[ast.expr, ast.expr | None]]:
    """(target, value) pairs of an assignment, a tuple assigned from a tuple taken apart."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) and \
                    len(target.elts) == len(node.value.elts):
                yield from zip(target.elts, node.value.elts)
            else:
                yield from ((t, None) for t in _targets(ast.Assign(targets=[target], value=node.value)))
    else:
        yield from ((t, None) for t in _targets(node))


def _module_lookup(value: ast.expr | None) -> str | None:
    if isinstance(value, ast.Call) and ast.unparse(value.func) in ("sys.modules.get", "importlib.import_module") \
            and value.args and isinstance(value.args[0], ast.Constant) and isinstance(value.args[0].value, str):
        return value.args[0].value
    return None


def _shallow(node: ast.AST) -> Iterator[ast.AST]:
    """The statements under `node` that run in its scope (not inside a nested function or class)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        yield child
        yield from _shallow(child)


def _import(dotted: str) -> object | None:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            obj = getattr(obj, part, None)
        return obj
    return None


def scan(trees: dict[Path, ast.Module] | None = None) -> list[tuple[str, int, str | None, str]]:
    """Every private torch/NVRx name in resctl's source: (file, line, path or None, name)."""
    trees = _trees() if trees is None else trees
    own = _own_names(trees)
    out = []
    for path, tree in trees.items():
        visitor = _Scan(own)
        visitor.visit(tree)
        out += [(str(path.relative_to(PKG.parent)), line, where, name) for line, where, name in visitor.found]
    return out


def listed(where: str | None, name: str) -> bool:
    if where is None:
        return any(e.name == name for e in nvrx_private.NAMES)
    return any(e.path == where or e.path.startswith(where + ".") for e in nvrx_private.NAMES)


def test_every_private_torch_or_nvrx_name_in_resctl_is_listed() -> None:
    found = scan()
    assert len(found) >= 40, "the scan sees the names the launcher is known to use"
    assert [f"{file}:{line}: {where or name}" for file, line, where, name in found if not listed(where, name)] == []


def test_the_scan_finds_each_way_a_private_name_is_reached(tmp_path: Path) -> None:
    source = '''
import torch
import torch.distributed as dist
from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as rdzv
import os

class Mine:
    def _helper(self):
        self._state = 1
        return self._state

def f(loader, patches):
    import sys
    os._exit(0)
    sys.modules.get("torch.distributed.tensor._random")
    getattr(loader, "_renamed_iterator", None)
    patches.set(loader, "_another_one", None)
    loader._helper()
    return torch._dynamo.reset(), dist.distributed_c10d._get_default_store(), rdzv._Action
'''
    tree = {tmp_path / "x.py": ast.parse(source)}
    own = _own_names(tree)
    visitor = _Scan(own)
    visitor.visit(tree[tmp_path / "x.py"])
    got = sorted((where or "", name) for _, where, name in visitor.found)
    assert got == sorted([
        ("", "_another_one"), ("", "_renamed_iterator"),
        ("nvidia_resiliency_ext.fault_tolerance._ft_rendezvous", "_ft_rendezvous"),
        ("nvidia_resiliency_ext.fault_tolerance._ft_rendezvous._Action", "_Action"),
        ("nvidia_resiliency_ext.fault_tolerance._ft_rendezvous", "_ft_rendezvous"),  # the import and the chain
        ("torch._dynamo", "_dynamo"), ("torch.distributed.distributed_c10d._get_default_store", "_get_default_store"),
        ("torch.distributed.tensor._random", "_random"),
    ])
    assert not listed(None, "_renamed_iterator") and listed("torch._dynamo", "_dynamo")


def test_an_override_of_a_torch_seam_counts_and_resctls_own_methods_do_not(tmp_path: Path) -> None:
    source = '''
from torch.utils.data import DataLoader

class Loader(DataLoader):
    def _get_iterator(self):
        return self._mine()

    def _mine(self):
        return None
'''
    tree = {tmp_path / "x.py": ast.parse(source)}
    visitor = _Scan(_own_names(tree))
    visitor.visit(tree[tmp_path / "x.py"])
    assert [(where, name) for _, where, name in visitor.found] == [
        ("torch.utils.data.DataLoader._get_iterator", "_get_iterator")]
