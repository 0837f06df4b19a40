"""Run a callback right after a module is first imported, wherever the import comes from.

An exec'd worker starts a new interpreter; `import torch` is ~1.7 CPU-s of it. Most of the shim's hooks
are torch's (the optimizer step hook, `init_process_group`, the checkpoint engine, the `torch.save`
interceptor), and a script that never imports torch needs none of them. The shim installs them when the
script imports torch instead of before it starts (`after_import`): the script's `import torch` returns a
module with every hook in place, as if the shim had imported it first, and a script that never imports it
starts as fast as under torchrun and finds no torch in `sys.modules`, as under torchrun.

The mechanism is the import system's own extension point (a `sys.meta_path` finder, PEP 451): the finder
answers only for the one name, returns the spec the other finders found with a loader that runs the real
loader's `exec_module` and then the callback, and puts the real loader back on the module and its spec (a
traceback's source lines, `importlib.resources` and `inspect` see what they would without it). It leaves
`sys.meta_path` once it has fired or when its patches are undone.
"""

from __future__ import annotations

import importlib.abc
import sys
from types import ModuleType
from typing import Any, Callable, Sequence

from resctl.patching import Patches


class _ThenLoader(importlib.abc.Loader):
    """The real loader, then `then(module)` once the module's code has run without error."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: Any) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class AfterImport(importlib.abc.MetaPathFinder):
    """The finder of `after_import`: answers for `name` only, once."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name, self._callback = name, callback

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.name or self not in sys.meta_path:
            return None
        later = sys.meta_path[sys.meta_path.index(self) + 1:]
        for finder in later:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None  # not installed: the import fails as it would without this finder
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _ThenLoader(spec.loader, self._fire)
        return spec

    def _fire(self, module: ModuleType) -> None:
        self.leave()
        self._callback(module)

    def leave(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def after_import(name: str, callback: Callable[[ModuleType], None], patches: Patches) -> bool:
    """Call `callback(module)` once `name` (a top-level module) is imported: now when it already is (True),
    else right after its first import completes, before the importer's next line (False)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return True
    finder = AfterImport(name, callback)
    sys.meta_path.insert(0, finder)
    patches.on_undo(finder.leave)
    return False
