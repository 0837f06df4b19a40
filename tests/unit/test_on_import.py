"""`resctl.shim.on_import.after_import`: torch's hooks in an exec'd worker when the script imports torch.
Real modules in a temporary directory, imported by the real import system."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

from resctl.patching import Patches
from resctl.shim import on_import


@pytest.fixture
def pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for this test's modules (names unique to the test; removed after)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        del sys.modules[name]


def test_the_callback_runs_after_the_first_import_before_the_importers_next_line(pkg: Path) -> None:
    (pkg / "late_mod.py").write_text("VALUE = 1\ndef f():\n    return 'source line'\n")
    (pkg / "importer_mod.py").write_text("import late_mod\nSEEN = late_mod.VALUE\n")
    seen: list[Any] = []
    patches = Patches("t")

    def hook(module: Any) -> None:
        seen.append(module.VALUE)
        module.VALUE = 2  # what the shim does: patch the freshly imported module

    assert on_import.after_import("late_mod", hook, patches) is False
    assert seen == []
    importer = importlib.import_module("importer_mod")
    assert seen == [1] and importer.SEEN == 2, "the importer's next line sees the patched module"
    late = sys.modules["late_mod"]
    assert not isinstance(late.__loader__, on_import._ThenLoader)
    assert late.__spec__.loader is late.__loader__
    assert "source line" in inspect.getsource(late.f)
    assert not any(isinstance(f, on_import.AfterImport) for f in sys.meta_path), "it leaves once fired"
    importlib.reload(late)
    assert seen == [1], "once"
    patches.undo()


def test_an_imported_module_gets_the_callback_now(pkg: Path) -> None:
    (pkg / "early_mod.py").write_text("X = 3\n")
    import early_mod  # noqa: F401

    seen: list[int] = []
    assert on_import.after_import("early_mod", lambda m: seen.append(m.X), Patches("t")) is True
    assert seen == [3]


def test_a_failing_or_missing_import_fails_as_without_it_and_undo_removes_the_finder(pkg: Path) -> None:
    (pkg / "broken_mod.py").write_text("raise RuntimeError('broken at import')\n")
    seen: list[Any] = []
    patches = Patches("t")
    on_import.after_import("broken_mod", seen.append, patches)
    on_import.after_import("absent_mod_xyz", seen.append, patches)
    with pytest.raises(RuntimeError, match="broken at import"):
        importlib.import_module("broken_mod")
    with pytest.raises(ModuleNotFoundError, match="absent_mod_xyz"):
        importlib.import_module("absent_mod_xyz")
    assert seen == []
    patches.undo()
    assert not any(isinstance(f, on_import.AfterImport) for f in sys.meta_path)


def test_a_submodule_import_first_still_fires_once_the_package_is_in(pkg: Path) -> None:
    (pkg / "pkg_x").mkdir()
    (pkg / "pkg_x" / "__init__.py").write_text("NAME = 'pkg'\n")
    (pkg / "pkg_x" / "sub.py").write_text("import pkg_x\nPARENT = pkg_x.NAME\n")
    seen: list[str] = []
    on_import.after_import("pkg_x", lambda m: seen.append(m.NAME), Patches("t"))
    from pkg_x import sub  # the package is imported first, by the import system

    assert seen == ["pkg"] and sub.PARENT == "pkg"


def test_torch_in_a_fresh_interpreter_gets_the_hook_before_the_next_line(tmp_path: Path) -> None:
    """The shim's own case, in a new interpreter (torch is imported in this one)."""
    script = textwrap.dedent(
        """
        import sys
        from resctl.patching import Patches
        from resctl.shim import on_import
        assert "torch" not in sys.modules
        on_import.after_import("torch", lambda t: setattr(t, "_resctl_probe", 1), Patches("t"))
        from torch import nn  # a submodule first: the package's import fires it
        import torch
        print(torch._resctl_probe, type(torch.__loader__).__name__)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "SourceFileLoader"]
