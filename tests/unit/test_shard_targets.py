"""A sharded checkpoint loads into a fresh FSDP2 model and a fresh optimizer (no state yet: it makes its
state at its first step), with no optimizer step run for it (a step would be counted as training):
one real rank on a gloo group, in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.ports import free_port

WORKER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from resctl.checkpoint import Checkpointer

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1,))

    def build():
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=0.1)

    ck = Checkpointer(dir=sys.argv[1], async_=False)
    model, opt = build()
    for step in (1, 2, 3):
        model(torch.full((2, 4), float(step))).sum().backward()
        opt.step()
        opt.zero_grad()
    ck.save({"model": model, "optim": opt, "info": {"step": 3}}, 3)
    steps = []
    from torch.optim.optimizer import register_optimizer_step_post_hook
    register_optimizer_step_post_hook(lambda *a: steps.append(1))
    fresh, fresh_opt = build()
    state = {"model": fresh, "optim": fresh_opt, "info": None}
    assert ck.load(state) == 3
    assert steps == [], "the load ran an optimizer step"
    assert state["info"] == {"step": 3}
    want, got = opt.state_dict(), fresh_opt.state_dict()
    assert want["state"].keys() == got["state"].keys()
    for pid, entry in want["state"].items():
        for k, v in entry.items():
            g = got["state"][pid][k]
            assert type(g) is type(v) and torch.equal(g.full_tensor() if hasattr(g, "full_tensor") else g,
                                                      v.full_tensor() if hasattr(v, "full_tensor") else v), (pid, k)
    for (n, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a.full_tensor(), b.full_tensor()), n
    print("ok", flush=True)
    os._exit(0)
    """
)


def test_a_fresh_optimizer_loads_its_sharded_state(tmp_path: Path) -> None:
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy for object collectives")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(repo), env.get("PYTHONPATH", "")])))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ck")], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr[-3000:]
