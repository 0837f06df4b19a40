"""Where a script's checkpoint bytes land when torch.save is not given a path: the two install points
that let `resctl.shim.snapshots` see them.

- **fsspec local files** (PyTorch Lightning and Fabric: `torch.save(checkpoint, BytesIO)`, then the
  bytes written through `fsspec.open(path, "wb")` inside a transaction): the `file` and `local`
  protocols are served by a subclass of fsspec's `LocalFileSystem` whose files report when they
  are complete (closed, or committed at the transaction's end), so the tracker can match them to
  the torch.save before them. Only files opened after the install are seen (a filesystem object
  the script made from `LocalFileSystem` directly is fsspec's own).
- **safetensors** (`save_file`/`load_file`, which transformers and accelerate use for model
  weights, and `save_model`/`load_model` call): wrapped at the module as soon as it is imported,
  before the libraries that import it bind them (`from safetensors.torch import save_file`).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import time
from typing import Any, Callable, Protocol

from resctl import console
from resctl.patching import Patches

PROTOCOLS = ("file", "local")


class Tracker(Protocol):
    """What the hooks report to (`resctl.shim.snapshots.SnapshotTracker`)."""

    @property
    def step(self) -> int: ...

    def saved(self, path: str, step: int, seconds: float) -> None: ...

    def loaded(self, path: str, seconds: float) -> None: ...

    def file_written(self, path: str) -> None: ...


def install(tracker: Tracker, patches: Patches) -> None:
    """Both hooks, each when its library is imported (now, if it already is): a script that never
    imports fsspec or safetensors pays nothing for them (fsspec's import: ~50 ms)."""
    for module, hook in (("fsspec", _install_fsspec), ("safetensors.torch", _install_safetensors)):
        run = functools.partial(_guarded, hook, tracker, patches)
        if module in sys.modules:
            run()
        else:
            finder = AfterImport(module, run)
            sys.meta_path.insert(0, finder)
            patches.on_undo(finder.remove)


def _guarded(hook: Callable[[Tracker, Patches], None], tracker: Tracker, patches: Patches) -> None:
    try:
        hook(tracker, patches)
    except Exception as err:  # noqa: BLE001 - a library resctl does not know: its saves go unseen, the run goes on
        console.line(f"resctl: checkpoints written through {hook.__name__[9:]} are not tracked ({type(err).__name__}: "
                     f"{err}); the report may miss them")


class AfterImport(importlib.abc.MetaPathFinder):
    """Calls `then()` once the module `name` has been executed, before the import statement that asked
    for it returns (so `from safetensors.torch import save_file` binds what `then` put there)."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        self.remove()  # once: the real finders answer from here on
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        execute, then = loader.exec_module, self.then

        def exec_module(module: Any) -> None:
            execute(module)
            then()

        loader.exec_module = exec_module  # this module's own loader object
        return spec


def _install_fsspec(tracker: Tracker, patches: Patches) -> None:
    try:
        import fsspec
        from fsspec.implementations.local import LocalFileOpener, LocalFileSystem
    except ImportError:
        return

    class ReportingFile(LocalFileOpener):  # type: ignore[misc]
        """A local file that tells the tracker when its bytes are in place."""

        def commit(self) -> None:
            super().commit()
            tracker.file_written(self.path)

        def close(self) -> None:
            super().close()
            self._written()

        def __exit__(self, *exc: Any) -> None:
            self._resctl_failed = exc[0] is not None  # a `with` block that raised left a partial file
            super().__exit__(*exc)
            self._written()

        def _written(self) -> None:
            # autocommit: the bytes are in place once the file is closed (in a transaction: at commit)
            if getattr(self, "_resctl_failed", False):
                return
            if self.autocommit and getattr(self.f, "closed", False) and not getattr(self, "_resctl_reported", False):
                self._resctl_reported = True
                tracker.file_written(self.path)

    class ReportingFileSystem(LocalFileSystem):  # type: ignore[misc]
        """fsspec's local filesystem, whose files written are `ReportingFile`s."""

        def _open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
            f = super()._open(path, mode, block_size, **kwargs)
            if type(f) is LocalFileOpener and "r" not in mode:
                f.__class__ = ReportingFile  # same state, one more report
            return f

        def __reduce__(self) -> Any:
            # By fsspec's registry, not by this class (defined here, it cannot be found by name): a copy is what
            # the process that unpickles it serves for "file" (this class under resctl, fsspec's own elsewhere).
            # Lightning's ModelCheckpoint, loggers and datasets sent to spawned loader workers hold one.
            if self.storage_args:
                return fsspec.spec.make_instance, (LocalFileSystem, self.storage_args, self.storage_options)
            return functools.partial(fsspec.filesystem, "file", **self.storage_options), ()

    registry = sys.modules["fsspec.registry"]._registry  # what register_implementation writes (the
    # package's `fsspec.registry` attribute is its read-only view, not the module)
    for name in PROTOCOLS:
        previous = registry.get(name)
        fsspec.register_implementation(name, ReportingFileSystem, clobber=True)
        patches.on_undo(functools.partial(_restore, registry, name, previous))


def _restore(registry: dict[str, Any], name: str, previous: Any) -> None:
    if previous is None:
        registry.pop(name, None)
    else:
        registry[name] = previous


def _install_safetensors(tracker: Tracker, patches: Patches) -> None:
    st = sys.modules["safetensors.torch"]

    orig_save, orig_load = st.save_file, st.load_file

    def save_file(tensors: Any, filename: Any, *args: Any, **kwargs: Any) -> Any:
        step, t0 = tracker.step, time.monotonic()
        result = orig_save(tensors, filename, *args, **kwargs)
        if isinstance(filename, str) or hasattr(filename, "__fspath__"):
            tracker.saved(_abspath(filename), step, time.monotonic() - t0)
        return result

    def load_file(filename: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        result = orig_load(filename, *args, **kwargs)
        if isinstance(filename, str) or hasattr(filename, "__fspath__"):
            tracker.loaded(_abspath(filename), time.monotonic() - t0)
        return result

    save_file.__doc__, load_file.__doc__ = orig_save.__doc__, orig_load.__doc__
    patches.set(st, "save_file", save_file)
    patches.set(st, "load_file", load_file)


def _abspath(filename: Any) -> str:
    return str(os.path.abspath(os.fspath(filename)))
