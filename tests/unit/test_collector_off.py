"""preload.collector_off: the cyclic collector off while the launcher (and a standby) import, back as it was after;
with `freeze`, what was imported is out of every later collection (docs/BENCHMARKS.md, "The collector off while
importing")."""

from __future__ import annotations

import gc
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from resctl.launch import preload


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was, and nothing left frozen by a test."""
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


@pytest.mark.parametrize("enabled", [True, False])
def test_off_inside_and_as_it_was_after(collector: None, enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    with preload.collector_off(freeze=False):
        assert not gc.isenabled()
    assert gc.isenabled() is enabled
    with pytest.raises(KeyError), preload.collector_off(freeze=False):
        raise KeyError("an import that failed")
    assert gc.isenabled() is enabled


def test_freeze_takes_what_was_made_inside_out_of_later_collections(collector: None) -> None:
    gc.unfreeze()
    with preload.collector_off(freeze=False):
        kept = [[i] for i in range(1000)]
    assert gc.get_freeze_count() == 0
    with preload.collector_off(freeze=True):
        kept += [[i] for i in range(1000)]
    assert gc.get_freeze_count() >= 2000 and gc.isenabled()
    assert not any(gc.is_tracked(x) and x in gc.get_objects(generation=2) for x in kept[-3:])


def test_the_late_preload_thread_imports_with_it_off_and_gives_it_back(collector: None, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "collector_probe.py").write_text("import gc\nENABLED = gc.isenabled()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    gc.enable()
    thread = threading.Thread(target=preload._import, args=(("collector_probe",),))
    thread.start()
    thread.join()
    try:
        assert sys.modules["collector_probe"].ENABLED is False
        assert gc.isenabled() and gc.get_freeze_count() > 0  # the launcher's modules, frozen
    finally:
        sys.modules.pop("collector_probe", None)
