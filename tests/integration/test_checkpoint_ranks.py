"""Across ranks, one step: 2 ranks under `resctl run` with sharded (DTensor) state; the newest
checkpoint's shard of rank 1 is damaged; the next run resumes both ranks from the newest step valid
on both (one back), and ends bitwise equal to a run that never failed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from resctl.checkpoint import format as fmt
from tests.integration.jobs import LOCAL_PROFILE, disk_kept_full, events, finish, start

pytestmark = [pytest.mark.slow, pytest.mark.nvrx_independent]

SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    import resctl.checkpoint as ckpt

    steps, out = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    w = distribute_tensor(torch.randn(64, 32), mesh, [Shard(0)])
    heartbeat = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)  # the shim counts optimizer steps
    state = {"w": {"weight": w}, "meta": {"seen": 0}}
    start = ckpt.load(state)
    print(f"[rank {rank}] resumed from {start}", flush=True)
    w = state["w"]["weight"]
    for step in range(start + 1, steps + 1):
        local = w.to_local()
        g = torch.Generator().manual_seed(1000 * step + rank)  # the update is a function of (step, rank)
        local.mul_(0.99).add_(torch.randn(local.shape, generator=g))
        state["meta"] = {"seen": step}
        heartbeat.step()
        ckpt.maybe_save(state, step)
    ckpt.wait()
    full = w.full_tensor()
    if rank == 0:
        torch.save({"w": full, "meta": state["meta"]}, out)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def _run(tmp: Path, name: str, ckpt_dir: Path, steps: int) -> str:
    args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(tmp / name),
            "--set", f"checkpoint.dir={ckpt_dir}", "--set", "checkpoint.interval_steps=4",
            str(tmp / "train_sharded.py"), str(steps), str(tmp / f"{name}.pt")]
    code, out = finish(start(args, cwd=tmp), timeout=240)
    assert code == 0, out[-4000:]
    return out


def test_one_ranks_damaged_shard_moves_every_rank_back_one_checkpoint(tmp_path: Path) -> None:
    pytest.importorskip("numpy")  # DCP's plan exchange uses gather_object
    (tmp_path / "train_sharded.py").write_text(SCRIPT)
    _run(tmp_path, "ref", tmp_path / "ref-ckpt", 12)

    ckpt_dir = tmp_path / "ckpt"
    _run(tmp_path, "first", ckpt_dir, 8)  # saves 4 and 8
    newest = ckpt_dir / fmt.step_dir_name(8)
    shard = max(newest.glob("__1_*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40  # a flipped bit in rank 1's shard only
    shard.write_bytes(bytes(data))

    out = _run(tmp_path, "second", ckpt_dir, 12)
    assert "[rank 0] resumed from 4" in out and "[rank 1] resumed from 4" in out, out[-3000:]
    ev = events(tmp_path / "second")
    assert sorted((e["rank"], e["step"]) for e in ev if e["kind"] == "resume") == [(0, 4), (1, 4)]
    skips = {e["rank"]: e for e in ev if e["kind"] == "ckpt_skip"}
    assert skips[1]["step"] == 8 and "checksum mismatch" in skips[1]["reason"] and skips[1]["quarantined"]
    assert skips[0]["step"] == 8 and "another rank" in skips[0]["reason"]
    assert {e["rank"] for e in ev if e["kind"] == "ckpt_other_run"} == {0, 1}  # run "first" wrote step 4

    ref, got = torch.load(tmp_path / "ref.pt", weights_only=True), torch.load(tmp_path / "second.pt", weights_only=True)
    assert got["meta"] == ref["meta"] == {"seen": 12}
    assert torch.equal(got["w"].view(torch.uint8), ref["w"].view(torch.uint8))  # bitwise


def test_full_disk_under_resctl_run_stops_with_the_cause_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    """2 ranks, checkpoints on a 4 MiB tmpfs that fills up mid-training: failed writes are reported
    and training goes on until `max_failed_saves` (3) in a row, then the job stops with the cause;
    the newest good checkpoint survives and loads."""
    import subprocess

    from resctl.checkpoint.engine import Checkpointer
    from tests.integration.jobs import EXAMPLES, wait_for

    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        ckpt_dir, run_dir = mnt / "ck", tmp_path / "full"
        args = ["-p", str(LOCAL_PROFILE), "--nproc-per-node", "2", "--run-dir", str(run_dir), "--max-restarts", "0",
                "--set", f"checkpoint.dir={ckpt_dir}", "--set", "checkpoint.interval_steps=5",
                str(EXAMPLES / "train_ckpt.py"), "--steps", "400", "--step-time", "0.05"]
        proc = start(args, cwd=tmp_path)

        def saved_10() -> bool:
            return any(e["kind"] == "ckpt_persist" and e["step"] >= 10 for e in events(run_dir))

        wait_for(saved_10, 120, "the checkpoint of step 10", proc)
        with disk_kept_full(mnt / "filler"):  # the disk is full from here on
            code, out = finish(proc, timeout=180)
        ev = events(run_dir)
        fails = [e for e in ev if e["kind"] == "ckpt_fail"]
        assert code != 0 and "SaveFailuresExceeded" in out and "No space left on device" in out, out[-3000:]
        assert [e["consecutive"] for e in fails] == [1, 2, 3], fails
        last_good = max(e["step"] for e in ev if e["kind"] == "ckpt_persist")
        steps = [e["step"] for e in ev if e["kind"] == "step" and e["rank"] == 0]
        assert max(steps) >= fails[-1]["step"]  # training went on past the first failures
        import torch

        from examples.train_ckpt import build_model  # type: ignore[import-not-found]

        model = build_model(8)
        state = {"model": model, "optim": torch.optim.Adam(model.parameters(), lr=1e-2)}
        assert Checkpointer(dir=ckpt_dir, rank=0, world_size=1, exclusive=False).load(state) == last_good
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
