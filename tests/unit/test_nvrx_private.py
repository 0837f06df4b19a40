"""The private NVRx/torch names resctl's launcher touches are all in the installed NVRx (CI runs this on
NVRx 0.4.1 and on 0.7.0), and a launcher that lacks one is refused before it starts (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata

import pytest

from resctl.launch import nvrx_private
from resctl.profile.nvrx_versions import CHECKED, series_for

VERSION = metadata.version("nvidia-resiliency-ext")


def test_every_private_name_the_launcher_touches_is_in_the_installed_nvrx() -> None:
    series = series_for(VERSION)
    assert [e.label for e in nvrx_private.missing(series)] == []
    mine = [e for e in nvrx_private.NAMES if series in e.series]
    assert len(mine) >= 20
    if VERSION in CHECKED:
        assert all(VERSION in e.checked for e in mine if VERSION in ("0.4.1", "0.7.0")), "the list says what was checked"


def test_a_name_the_installed_nvrx_lacks_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = nvrx_private.Private(f"{nvrx_private.LAUNCHER}:LocalElasticAgent", "_renamed_in_a_later_release",
                                "method", "a test")
    instance = nvrx_private.Private(f"{nvrx_private.LAUNCHER}:LocalElasticAgent", "_no_such_state", "instance", "a test")
    assert not nvrx_private.present(gone) and not nvrx_private.present(instance)
    monkeypatch.setattr(nvrx_private, "NAMES", (*nvrx_private.NAMES, gone))
    why = nvrx_private.refusal(VERSION)
    assert why is not None and "LocalElasticAgent._renamed_in_a_later_release" in why and VERSION in why
    assert "0.4.x or 0.6.x-0.7.x" in why


def test_the_torch_names_the_workers_touch_are_in_the_installed_torch_imported_too() -> None:
    """The launcher reads a module it has not imported (torch._dynamo costs a second); importing agrees."""
    import importlib

    import torch

    names = [e for e in nvrx_private.NAMES if e.torch_checked]
    assert {"_get_default_store", "_rng_tracker", "_dynamo", "_num_yielded"} <= {e.name for e in names}
    for entry in names:
        assert nvrx_private.present(entry), entry.label
        if ":" not in entry.owner:
            module = importlib.import_module(entry.owner)
            assert hasattr(module, entry.name) or entry.kind == "module", entry.path
            if entry.kind == "module":
                importlib.import_module(entry.path)
    if torch.__version__.split("+")[0] in nvrx_private.TORCH_CHECKED:
        assert all(torch.__version__.split("+")[0] in e.torch_checked for e in names)


def test_a_torch_name_the_installed_torch_lacks_is_refused_naming_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    gone = nvrx_private.Private("torch.distributed.tensor._random", "_renamed_tracker", "attribute", "a test")
    module = nvrx_private.Private("torch", "_no_such_module", "module", "a test")
    assert not nvrx_private.present(gone) and not nvrx_private.present(module)
    monkeypatch.setattr(nvrx_private, "NAMES", (*nvrx_private.NAMES, gone))
    why = nvrx_private.refusal(VERSION)
    assert why is not None and f"torch {torch.__version__} lacks _random._renamed_tracker" in why
    assert f"NVRx {VERSION} lacks" not in why


@pytest.mark.parametrize("version", ["0.5.0", "0.8.0", "1.0.0", "0.3.2"])
def test_a_version_out_of_range_is_refused_with_the_range(version: str) -> None:
    why = nvrx_private.refusal(version)
    assert why is not None and f"NVRx {version} is not supported" in why and "0.4.x or 0.6.x-0.7.x" in why


def test_the_launcher_exits_2_before_it_starts_on_an_nvrx_it_cannot_drive(tmp_path) -> None:
    """A real launcher process, with a stand-in distribution that says it is NVRx 0.9.0 first on the path."""
    dist = tmp_path / "nvidia_resiliency_ext-0.9.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-resiliency-ext\nVersion: 0.9.0\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-m", "resctl.launch.ft_entry", "--nproc-per-node", "1", "x.py"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "NVRx 0.9.0 is not supported" in done.stderr and "Traceback" not in done.stderr


def test_inprocess_on_an_nvrx_without_it_is_refused_with_the_alternative() -> None:
    from resctl.errors import UsageError
    from resctl.launch.execute import inprocess_available
    from resctl.profile.load import resolve

    resolved = resolve(None, sets=["inprocess.enabled=true"])
    inprocess_available(resolved, "0.4.1", find=lambda name: object())
    with pytest.raises(UsageError) as refused:
        inprocess_available(resolved, "0.4.1", find=lambda name: None)
    message = str(refused.value)
    assert "NVRx 0.4.1 has no in-process restart" in message and "inprocess.enabled = false" in message
    assert "in-job restart" in message
    with pytest.raises(UsageError) as refused:
        inprocess_available(resolved, "0.7.0", find=lambda name: object())
    assert "NVRx 0.7.0 deprecated in-process restart" in str(refused.value) and "in-job" in str(refused.value)


def test_resctl_run_refuses_inprocess_on_nvrx_07_before_launch(tmp_path) -> None:
    """The real CLI with the installed NVRx: refused (exit 2, no traceback) on 0.6+, planned on 0.4."""
    script = tmp_path / "one.py"
    script.write_text("print('ran')\n")
    done = subprocess.run([sys.executable, "-m", "resctl", "run", "--dry-run", "--set", "inprocess.enabled=true",
                           str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    if series_for(VERSION) == "0.4":
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 2 and f"NVRx {VERSION} deprecated in-process restart" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
