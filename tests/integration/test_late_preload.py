"""The launcher's late preload follows what its forked workers imported (resctl.launch.preload): a script
that builds an optimizer (torch then imports torch._dynamo, and FSDP with it) has the launcher import
them for its restarted workers; a script that never does leaves the launcher without them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, finish, start

pytestmark = pytest.mark.slow
SAID = "late preload: importing torch._dynamo"


def _launcher_log(tmp: Path, name: str, script: list[str]) -> str:
    run_dir = tmp / name
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "1", "--run-dir", str(run_dir),
            "--set", f"checkpoint.dir={tmp / (name + '-ckpt')}", *script]
    code, out = finish(start(args, cwd=tmp), timeout=180)
    assert code == 0, out[-3000:]
    return (run_dir / "launcher.log").read_text()


def test_the_launcher_imports_the_late_modules_when_a_worker_did_and_only_then(tmp_path: Path) -> None:
    idle = tmp_path / "idle.py"  # torch and a process group, no optimizer, past LATE_AFTER (3 s)
    idle.write_text("import time\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
                    "time.sleep(6)\ndist.destroy_process_group()\n")
    assert SAID not in _launcher_log(tmp_path, "idle", [str(idle)])
    # Adam's first step after 60 steps of 0.1 s: the launcher hears of it at the first step
    log = _launcher_log(tmp_path, "train", [str(EXAMPLES / "train_ckpt.py"), "--steps", "60", "--step-time", "0.1"])
    assert SAID in log, log[-3000:]
