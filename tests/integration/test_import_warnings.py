"""Warnings raised while torch is imported reach the console from every worker, as from torchrun's: a
forked worker gets torch already imported by the launcher (launch/preload.py), which records what the
import warned, and shows it again through the worker's own filters (shim/forked.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from resctl.launch import preload
from tests.ports import free_port

BIN = Path(sys.executable).parent


def _torch_import_warnings() -> list[str]:
    """What `import torch` warns in a new interpreter here (the pynvml FutureWarning where pynvml is installed)."""
    proc = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, timeout=120)
    return [line for line in proc.stderr.splitlines() if "Warning: " in line]


@pytest.mark.slow
def test_each_worker_shows_what_importing_torch_warned_in_every_mode(tmp_path: Path) -> None:
    expected = _torch_import_warnings()
    if not expected:
        pytest.skip("importing torch warns nothing on this machine")
    script = tmp_path / "uses_torch.py"
    script.write_text("import torch\nprint('done', flush=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESCTL_", "PYTHONWARNINGS"))}
    counts = {}
    for mode in ("torchrun", "fork", "exec"):
        if mode == "torchrun":
            cmd = [str(BIN / "torchrun"), "--master-port", str(free_port())]
        else:
            cmd = [str(BIN / "resctl"), "run", "--run-dir", str(tmp_path / mode), "--set", f"launch.worker_start={mode}"]
        proc = subprocess.run([*cmd, "--nproc-per-node", "2", str(script)], capture_output=True, text=True,
                              timeout=180, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        counts[mode] = sum((proc.stdout + proc.stderr).count(line) for line in expected)
    # torchrun's own process imports torch too and prints it once more; resctl's launcher keeps its copy
    # in launcher.log (a quiet console)
    assert counts == {"torchrun": 3 * len(expected), "fork": 2 * len(expected), "exec": 2 * len(expected)}, counts


def test_recorded_import_warnings_go_through_the_workers_filters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "warns_at_import.py").write_text("import warnings\nwarnings.warn('old thing', FutureWarning)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(preload.ImportWarnings, "recorded", [])
    with preload.ImportWarnings.recording():
        import warns_at_import  # noqa: F401
    assert [str(w.message) for w in preload.ImportWarnings.recorded] == ["old thing"]
    with warnings.catch_warnings(record=True) as shown:
        warnings.resetwarnings()
        warnings.simplefilter("default")  # a new interpreter's for FutureWarning
        preload.ImportWarnings.replay()
        preload.ImportWarnings.replay()  # a second worker forked from the same launcher shows it too
    assert [(str(w.message), Path(w.filename).name, w.lineno) for w in shown] == [("old thing", "warns_at_import.py", 2)] * 2
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("ignore")  # PYTHONWARNINGS=ignore: the worker shows nothing
        preload.ImportWarnings.replay()
    assert shown == []
