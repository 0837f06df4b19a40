"""The launcher's late preload (resctl.launch.preload, `launch.late_preload`): late (auto on a node without
spare cores, as CI's) imports torch._dynamo and FSDP when a worker's script did and only then; after-restart
only once the job has restarted; at-once beside the first workers, whatever the script, and the job still
ends at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.jobs import EXAMPLES, LOCAL_PROFILE, finish, start

pytestmark = pytest.mark.slow
SAID = "late preload: importing torch._dynamo"
TRAIN = [str(EXAMPLES / "train_ckpt.py"), "--steps", "60", "--step-time", "0.1"]


def _launcher_log(tmp: Path, name: str, script: list[str], sets: tuple[str, ...] = (),
                  faults: str | None = None) -> str:
    run_dir = tmp / name
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "1", "--run-dir", str(run_dir),
            "--set", f"checkpoint.dir={tmp / (name + '-ckpt')}", *(x for s in sets for x in ("--set", s)), *script]
    code, out = finish(start(args, cwd=tmp, env={"RESCTL_FAULTS": faults} if faults else {}), timeout=180)
    assert code == 0, out[-3000:]
    return (run_dir / "launcher.log").read_text()


def test_after_restart_only_a_job_that_restarted_imports_them(tmp_path: Path) -> None:
    # Adam's first step, 60 steps of 0.1 s: no restart, no import
    log = _launcher_log(tmp_path, "train", TRAIN, ("launch.late_preload=after-restart",))
    assert SAID not in log, log[-3000:]
    # the same job, rank 0 killed at step 5: its restarted workers' note starts the import
    log = _launcher_log(tmp_path, "killed", TRAIN, ("launch.late_preload=after-restart",), faults="sigkill@5:0")
    assert "sigkill" in log.lower() or "restart" in log.lower(), log[-3000:]
    assert SAID in log, log[-3000:]


def test_late_imports_them_when_a_worker_did_and_only_then(tmp_path: Path) -> None:
    idle = tmp_path / "idle.py"  # torch and a process group, no optimizer, past LATE_AFTER (3 s)
    idle.write_text("import time\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
                    "time.sleep(6)\ndist.destroy_process_group()\n")
    assert SAID not in _launcher_log(tmp_path, "idle-late", [str(idle)], ("launch.late_preload=late",))
    log = _launcher_log(tmp_path, "train-late", TRAIN, ("launch.late_preload=late",))
    assert SAID in log, log[-3000:]


def test_at_once_imports_them_beside_the_first_workers_whatever_the_script(tmp_path: Path) -> None:
    idle = tmp_path / "idle.py"  # torch and a process group, no optimizer
    idle.write_text("import time\nimport torch.distributed as dist\n\ndist.init_process_group('gloo')\n"
                    "time.sleep(2)\ndist.destroy_process_group()\n")
    log = _launcher_log(tmp_path, "idle", [str(idle)], ("launch.late_preload=at-once",))
    assert SAID in log, log[-3000:]
    noop = tmp_path / "noop.py"  # ends before the import can: the launcher abandons it and ends
    noop.write_text("print('done')\n")
    log = _launcher_log(tmp_path, "noop", [str(noop)], ("launch.late_preload=at-once",))
    assert SAID in log, log[-3000:]
