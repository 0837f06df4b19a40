"""SIGKILL a process while it writes checkpoints, 24 times (RESCTL_KILLS for a longer hunt): the newest complete checkpoint must
always load, and its contents must be self-consistent (every value belongs to the same step).
Every step the child saves twice: through the engine (`Checkpointer.save`) and through an
intercepted `torch.save` of a snapshot file, so kills land in both writers; after each restart no
temp file is left (the kills' leftovers are removed at the next start, counted before it writes)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from resctl.checkpoint import engine, intercept
from resctl.checkpoint import format as fmt
from resctl.checkpoint.engine import Checkpointer
from tests.zygote import zygote

CHILD = textwrap.dedent(
    """
    import sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    from resctl.checkpoint import Checkpointer, intercept

    root, async_, snap = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
    ck = Checkpointer(dir=root, async_=async_, keep_last=2, writers=4, rank=0, world_size=1)
    model = torch.nn.Linear(256, 256)
    state = {
        "model": model,
        "a": torch.zeros(1 << 20),                      # 4 MiB float32
        "b": torch.zeros(1 << 20, dtype=torch.int64),   # 8 MiB
        "info": {"step": 0},
    }
    step = ck.load(state)
    intercept.install(snap.rsplit("/", 1)[0] + "/*.pt", ck.writes)
    print("up", step, flush=True)
    sys.stdin.readline()  # the test counts the leftovers before this child writes its own
    while True:
        step += 1
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(step)
        state["a"].fill_(step)
        state["b"].fill_(step)
        state["info"] = {"step": step}
        ck.save(state, step)
        torch.save({"step": step, "a": state["a"]}, snap)
    """
)


def _check(root: Path, scratch: Path) -> int:
    """Load the newest checkpoint from a copy of the step directories (so the leftovers stay for
    the next child to clean up) and check that every value belongs to its step."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    for _, path in fmt.list_step_dirs(root):
        shutil.copytree(path, scratch / path.name)
    model = torch.nn.Linear(256, 256)
    state: dict[str, Any] = {"model": model, "a": None, "b": None, "info": None}
    step = Checkpointer(dir=scratch, rank=0, world_size=1, exclusive=False).load(state)
    assert not (scratch / ".quarantine").exists(), "a published checkpoint was damaged"
    if step == 0:
        return 0
    assert state["info"] == {"step": step}
    assert torch.equal(state["a"], torch.full((1 << 20,), float(step)))
    assert torch.equal(state["b"], torch.full((1 << 20,), step, dtype=torch.int64))
    for p in model.parameters():
        assert bool((p == step).all())
    return step


def _check_snapshot(snap: Path) -> int:
    """The intercepted torch.save file: absent, or complete, matching its sidecar, one step."""
    if not snap.exists():
        return 0
    intercept.verify(snap)
    obj = torch.load(snap, weights_only=True)
    assert torch.equal(obj["a"], torch.full((1 << 20,), float(obj["step"])))
    return int(obj["step"])


def _leftovers(root: Path, snap_dir: Path) -> list[str]:
    found = [e.name for e in os.scandir(root) if e.name.startswith(engine.LEFTOVERS)] if root.exists() else []
    found += [e.name for e in os.scandir(snap_dir) if intercept.TMP_MARK in e.name]
    return found


KILLS = int(os.environ.get("RESCTL_KILLS", "24"))


@pytest.mark.slow
@pytest.mark.nvrx_independent  # no launcher: the engine in one process
def test_sigkill_during_writes_never_leaves_a_loadable_torn_checkpoint(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = tmp_path / "ck"
    snap_dir = tmp_path / "snap"
    snap_dir.mkdir()
    snap = snap_dir / "snapshot.pt"
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH", "")])), OMP_NUM_THREADS="1")
    rng = random.Random(1234)
    last = last_snap = 0
    torn = 0  # kills that left a temp file or directory behind (reported: it depends on timing)
    after_start = []  # leftovers seen once the next child is up (its load and install have run)
    for i in range(KILLS):
        child = zygote().popen(
            [sys.executable, str(script), str(root), "1" if i % 2 == 0 else "0", str(snap)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.startswith("up "), child.stderr.read() if child.stderr else line
            assert int(line.split()[1]) == last  # the child resumed from what we verified
            after_start.append(len(_leftovers(root, snap_dir)))
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
            time.sleep(rng.uniform(0.0, 0.8))
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        torn += bool(_leftovers(root, snap_dir))
        step = _check(root, tmp_path / "scratch")
        # A newer checkpoint only replaces older ones once complete: progress never goes back.
        assert step >= last
        last = step
        snap_step = _check_snapshot(snap)
        assert snap_step >= last_snap
        last_snap = snap_step
        visible = fmt.list_step_dirs(root)
        assert len([s for s, p in visible if (p / fmt.MANIFEST).exists()]) <= 3
    assert last > 0 and last_snap > 0
    assert max(after_start) == 0, after_start
    print(f"{KILLS} kills, {torn} left a temp file or dir; after the next start: max {max(after_start)} "
          f"(total {sum(after_start)}); newest step loaded: {last}, snapshot step {last_snap}")
