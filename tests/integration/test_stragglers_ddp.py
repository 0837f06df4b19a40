"""A slow rank named in a synchronous job (issue 32): a plain DDP loop over gloo, every rank waiting for the
slowest in the gradient all-reduce, so step times are equal. One rank 40 ms slower a step is named on the
console and in `resctl report` by its own work before the all-reduce; balanced 2- and 4-rank jobs name no
one. The same unmodified script under torchrun trains to the same weights (the timed hook is DDP's
all-reduce)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.jobs import events, finish, start, torchrun
from tests.ports import free_port

pytestmark = pytest.mark.slow

DDP_LOOP = textwrap.dedent("""
    import hashlib, os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, slow = int(os.environ["RANK"]), int(os.environ.get("SLOW_RANK", "-1"))
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(rank)
    for step in range(1, int(os.environ.get("STEPS", "150")) + 1):
        if rank == slow:
            time.sleep(0.04)  # a slow rank: 40 ms more work a step
        model(torch.randn(16, 64, generator=data)).sum().backward()
        opt.step()
        opt.zero_grad()
    if rank == 0:
        weights = torch.cat([p.detach().flatten() for p in model.parameters()])
        open(sys.argv[1], "w").write(" ".join(f"{v:.6e}" for v in weights.tolist()))
    dist.destroy_process_group()
""")


def _run(tmp: Path, nproc: int, slow: int, name: str) -> tuple[str, Path, Path]:
    script = tmp / "ddp_loop.py"
    script.write_text(DDP_LOOP)
    run_dir, weights = tmp / name, tmp / f"{name}.weights"
    args = ["--nproc-per-node", str(nproc), "--run-dir", str(run_dir), "--set", f"checkpoint.dir={tmp / 'ckpt'}",
            str(script), str(weights)]
    code, out = finish(start(args, cwd=tmp, env={"SLOW_RANK": str(slow)}), timeout=300)
    assert code == 0, out[-3000:]
    return out, run_dir, weights


def _report(run_dir: Path) -> tuple[str, dict]:
    text = subprocess.run([sys.executable, "-m", "resctl", "report", str(run_dir)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})
    data = subprocess.run([sys.executable, "-m", "resctl", "report", str(run_dir), "--json"], capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0 and data.returncode == 0, text.stderr + data.stderr
    return text.stdout, json.loads(data.stdout)


def test_a_rank_40ms_slower_in_a_ddp_loop_is_named_on_the_console_and_in_the_report(tmp_path: Path) -> None:
    out, run_dir, weights = _run(tmp_path, 2, slow=1, name="slow")
    assert out.count("is a straggler") == 1 and "rank 1 is a straggler: its own work before the gradient" in out, \
        out[-3000:]
    named = [e for e in events(run_dir) if e["kind"] == "straggler"]
    assert [(e["rank"], e["measure"]) for e in named] == [(1, "busy")], named
    assert named[0]["step"] <= 60, f"named late: step {named[0]['step']} of 150"  # straggler_steps 20 + window
    text, data = _report(run_dir)
    rows = {r["rank"]: r for r in data["rank_steps"]}
    assert rows[1]["straggler_events"] == 1 and rows[0]["straggler_events"] == 0
    assert rows[1]["ratio_of"] == "busy" and rows[1]["ratio"] > 1.5 > rows[0]["ratio"], rows
    assert "named x1" in text and "own work" in text, text

    # The same script under torchrun: the same weights (the timed hook is DDP's own all-reduce).
    torch_weights = tmp_path / "torchrun.weights"
    done = torchrun(["--nproc-per-node", "2", "--master-port", str(free_port()), str(tmp_path / "ddp_loop.py"),
                     str(torch_weights)], cwd=tmp_path, timeout=300,
                    env={**os.environ, "SLOW_RANK": "1", "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    ours = [float(v) for v in weights.read_text().split()]
    theirs = [float(v) for v in torch_weights.read_text().split()]
    assert len(ours) == len(theirs) and max(abs(a - b) for a, b in zip(ours, theirs)) < 1e-5


@pytest.mark.parametrize("nproc", [2, 4])
def test_a_balanced_ddp_job_names_no_one(tmp_path: Path, nproc: int) -> None:
    out, run_dir, _ = _run(tmp_path, nproc, slow=-1, name=f"even{nproc}")
    assert "is a straggler" not in out, out[-3000:]
    assert not [e for e in events(run_dir) if e["kind"] == "straggler"]
    busy = [e for e in events(run_dir) if e["kind"] == "step" and "busy" in e]
    assert {e["rank"] for e in busy} == set(range(nproc)), "every rank's own work is timed"
