"""Sharded (DTensor) state through DCP: 2 real ranks on a gloo process group, on CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.ports import free_port
from tests.zygote import zygote

WORKER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from resctl.checkpoint import Checkpointer

    root, phase = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    ck = Checkpointer(dir=root, writers=2, keep_last=2)
    full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    if phase == "save":
        w = distribute_tensor(full, mesh, [Shard(0)])
        for step in (1, 2):
            ck.save({"w": {"weight": w}, "meta": {"epoch": step}}, step)
            # The save returned once staged: the loop may change the state while the write runs.
            w.to_local().mul_(2.0 if step == 1 else 100.0)
        ck.wait()
    elif phase == "fail":  # rank 1's write of step 3 fails: nobody publishes it, every rank reports it
        from resctl.telemetry.events import EventLog
        ck = Checkpointer(dir=root, writers=2, keep_last=5, events=EventLog(root + "-events", rank=rank))
        w = distribute_tensor(full * 3, mesh, [Shard(0)])
        if rank == 1:
            ck.fail_next_write("injected: disk gone")
        ck.save({"w": {"weight": w}, "meta": {"epoch": 3}}, 3)
        ck.wait()
        assert ck.failed_in_a_row == 1, ck.failed_in_a_row
        assert ck.last_saved_step is None, ck.last_saved_step
    else:
        w = distribute_tensor(torch.zeros(8, 8), mesh, [Shard(0)])
        state = {"w": {"weight": w}, "meta": None}
        step = ck.load(state)
        assert step == 2, step
        assert state["meta"] == {"epoch": 2}, state["meta"]
        local = state["w"]["weight"].to_local()
        # Step 2's bytes are the state when save(2) returned, not the *100 made while it was written.
        assert torch.equal(local, (full * 2)[rank * 4:(rank + 1) * 4]), local
    dist.barrier()
    dist.destroy_process_group()
    print("ok", rank, phase, flush=True)
    # Skip interpreter teardown: once rank 0 (the TCPStore host) is gone, a late store call from
    # c10d's teardown on rank 1 sometimes aborts ("terminate called without an active exception").
    os._exit(0)
    """
)


def _run(script: Path, root: Path, phase: str, *args: str, **extra: str) -> None:
    port = free_port()
    repo = Path(__file__).resolve().parents[2]
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
        env.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
            LOCAL_RANK=str(rank), OMP_NUM_THREADS="1",
            PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH", "")])), **extra,
        )
        procs.append(zygote().popen([sys.executable, str(script), str(root), phase, *args], env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out


def test_dtensor_state_saves_per_rank_and_loads(tmp_path: Path) -> None:
    # DCP's planner exchanges plans with gather_object, which torch implements through numpy.
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy for object collectives")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root = tmp_path / "ck"
    _run(script, root, "save")
    step_dir = root / "step-000000002"
    names = {p.name for p in step_dir.iterdir()}
    # Each rank wrote its own shard file; nothing was gathered on rank 0.
    assert {"manifest.json", "meta.pt", ".metadata", "__0_0.distcp", "__1_0.distcp"} <= names, names
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["step-000000001", "step-000000002"]
    _run(script, root, "load")


def test_failed_shard_write_on_one_rank_publishes_nothing_and_fails_on_every_rank(tmp_path: Path) -> None:
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy for object collectives")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root = tmp_path / "ck"
    _run(script, root, "save")
    _run(script, root, "fail")
    # Step 3 never became visible (no directory, no temp left behind by rank 0), steps 1-2 are intact.
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == ["step-000000001", "step-000000002"]
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    for rank in (0, 1):
        events = [json.loads(line) for line in (tmp_path / "ck-events" / f"events-rank{rank}.jsonl").read_text().splitlines()]
        failures = [e for e in events if e["kind"] == "ckpt_fail"]
        assert [e["step"] for e in failures] == [3], (rank, failures)
        assert "injected: disk gone" in failures[0]["error"] if rank == 1 else "another rank" in failures[0]["error"]
    _run(script, root, "load")  # the newest good checkpoint still loads: step 2


FSDP_WORKER = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from resctl.checkpoint import Checkpointer
    from resctl.telemetry.events import EventLog

    root, phase = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Linear(10, 3))  # 10 rows: uneven shards of 5 and 5, 3: 2 and 1
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)

    def step(i):
        g = torch.Generator().manual_seed(i * 10 + rank)
        opt.zero_grad()
        model(torch.randn(4, 6, generator=g)).square().mean().backward()
        opt.step()

    if phase == "train":
        step(0)  # a restarted process's optimizer has no state until its first step (the resume below)
    else:
        g = torch.Generator().manual_seed(rank)  # the restart's model starts elsewhere: the restore must overwrite it
        for p in model.parameters():
            p.data.to_local().copy_(torch.randn(p.data.to_local().shape, generator=g))
    events = EventLog(root + "-events-" + phase, rank=rank)
    disk = len(sys.argv) > 3  # disk checkpoints at the snapshots' steps (written from them), loaded without memory
    every = (3 if phase == "train" else 0, 3) if disk else (3, 100)
    last = 13 if disk else 7  # disk: 4 saves from the 2 slots, the last two from wrappers kept in the slots
    ck = Checkpointer(dir=root, memory_every=every[0], interval_steps=every[1], run_id="run-fsdp", events=events)
    state = {"model": model, "optim": opt}
    if phase == "train":  # steps 1..last: snapshots every 3 in memory (and on disk, from them)
        from resctl.checkpoint import sharded
        wrap, built = sharded._wrap, []
        sharded._wrap = lambda *a: built.append(1) or wrap(*a)
        for i in range(1, last + 1):
            step(i)
            ck.maybe_save(state, i)
        ck.wait()
        assert len(built) == (2 if disk else 0), len(built)  # DTensor wrappers of a slot's views: once a slot
        torch.save({k: v.full_tensor() for k, v in model.state_dict().items()}, root + f"-at{last}-rank{rank}.pt")
        os._exit(0)  # as a kill would: the snapshots stay in shared memory
    resumed = ck.load(state)
    assert resumed == last - 1, resumed
    step(last)  # the step after the snapshot again: bitwise the first run's
    want = torch.load(root + f"-at{last}-rank{rank}.pt")
    got = {k: v.full_tensor() for k, v in model.state_dict().items()}
    assert all(torch.equal(want[k], got[k]) for k in want), [k for k in want if not torch.equal(want[k], got[k])]
    import json
    with open(os.path.join(root + "-events-" + phase, f"events-rank{rank}.jsonl")) as f:
        tiers = [e.get("tier") for e in map(json.loads, f) if e["kind"] == "ckpt_load"]
    assert tiers == (["disk"] if disk else ["memory"]), tiers
    ck.release_memory()
    dist.barrier()
    print("ok", rank, phase, flush=True)
    os._exit(0)
    """
)


def test_fsdp2_shards_snapshot_into_the_memory_tier_and_restore_bitwise(tmp_path: Path) -> None:
    """Each rank keeps its own shards of an FSDP2 model and its optimizer in its memory tier; new
    processes (a restart) restore them from memory and go on bitwise as the first run did."""
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy for object collectives")
    shm = tmp_path / "shm"
    shm.mkdir()
    script = tmp_path / "fsdp_worker.py"
    script.write_text(FSDP_WORKER)
    root = tmp_path / "ck"
    _run(script, root, "train", RESCTL_SHM_DIR=str(shm))
    assert not root.exists() or not [p for p in root.iterdir() if p.name.startswith("step-")]  # memory only
    assert list(shm.iterdir()), "no snapshot in the memory tier"
    _run(script, root, "resume", RESCTL_SHM_DIR=str(shm))


def test_fsdp2_disk_checkpoints_written_from_memory_snapshots_load_bitwise(tmp_path: Path) -> None:
    """A sharded disk save at a memory snapshot's step writes the snapshot's bytes (no second copy of the
    shards), through DTensor wrappers of the slot's views built once a slot (the saves at 9 and 12 reuse
    those of 3 and 6, over the new bytes): loaded from disk alone by new processes, step 13 is bitwise the
    first run's."""
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy for object collectives")
    shm = tmp_path / "shm"
    shm.mkdir()
    script = tmp_path / "fsdp_worker.py"
    script.write_text(FSDP_WORKER)
    root = tmp_path / "ck"
    _run(script, root, "train", "disk", RESCTL_SHM_DIR=str(shm))
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step-")) == ["step-000000009", "step-000000012"]
    _run(script, root, "resume", "disk", RESCTL_SHM_DIR=str(tmp_path / "empty-shm"))


# --- a lost node: its rank's shards come back from the buddy node's copy ----------------------------

FSDP_BUDDY_WORKER = textwrap.dedent(
    """
    import os, sys, time, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from resctl.checkpoint import replica
    from resctl.checkpoint.engine import Checkpointer
    from resctl.telemetry.events import EventLog

    tmp, phase = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 10), nn.Linear(10, 3))  # uneven shards: 5+5 rows, 2+1 rows
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    state = {"model": model, "optim": opt}

    def step(i):
        g = torch.Generator().manual_seed(i * 10 + rank)
        opt.zero_grad()
        model(torch.randn(4, 6, generator=g)).square().mean().backward()
        opt.step()

    def mine():  # this rank's shards of the model and of AdamW's state, and the step counts
        local = lambda v: v.to_local().clone() if hasattr(v, "to_local") else v.clone()
        return {"model": {k: local(v) for k, v in model.state_dict().items()},
                "optim": {pid: {k: local(v) for k, v in s.items()} for pid, s in opt.state_dict()["state"].items()}}

    ck = Checkpointer(dir=tmp + "/ck", interval_steps=10**6, memory_every=2, memory_replicate=True, run_id="run-r",
                      events=EventLog(tmp + "/ev-" + phase, rank=rank))
    if phase == "train":  # steps 1..5: snapshots of 2 and 4 in memory and at the buddy, no disk checkpoint
        assert ck.load(state) == 0
        for i in range(1, 6):
            step(i)
            ck.maybe_save(state, i)
            if i % 2 == 0:
                ck.wait()
                rep = ck.memory_tier().replicator
                for _ in range(400):  # the copy reaches the buddy before the next snapshot
                    if i in {p.step for p in replica.listing(rep.addr, rep.key, rank)}:
                        break
                    time.sleep(0.025)
                else:
                    raise SystemExit(f"step {i} never reached the buddy")
            if i == 4:
                torch.save(mine(), f"{tmp}/at4-rank{rank}.pt")
        torch.save({k: v.full_tensor() for k, v in model.state_dict().items()}, f"{tmp}/at5.pt")
        os._exit(0)  # as a kill would: the snapshots stay where they are
    g = torch.Generator().manual_seed(rank + 7)  # the new process's model starts elsewhere
    for p in model.parameters():
        p.data.to_local().copy_(torch.randn(p.data.to_local().shape, generator=g))
    resumed = ck.load(state)
    assert resumed == 4, resumed
    want, got = torch.load(f"{tmp}/at4-rank{rank}.pt"), mine()
    assert want["model"].keys() == got["model"].keys() and want["optim"].keys() == got["optim"].keys()
    assert all(torch.equal(want["model"][k], got["model"][k]) for k in want["model"]), "model shards differ"
    assert all(want["optim"][p].keys() == got["optim"][p].keys() and
               all(torch.equal(want["optim"][p][k], got["optim"][p][k]) for k in want["optim"][p])
               for p in want["optim"]), "AdamW state differs"
    assert all(isinstance(v, torch.Tensor) and hasattr(v, "to_local") for s in opt.state.values()
               for k, v in s.items() if k != "step"), "AdamW's moments are not DTensors like their parameters"
    step(5)  # the step after 4 again: bitwise the fault-free run's step 5
    at5 = torch.load(f"{tmp}/at5.pt")
    now = {k: v.full_tensor() for k, v in model.state_dict().items()}
    assert all(torch.equal(at5[k], now[k]) for k in at5), [k for k in at5 if not torch.equal(at5[k], now[k])]
    dist.barrier()
    print("ok", rank, phase, flush=True)
    os._exit(0)
    """
)


@pytest.mark.slow
@pytest.mark.nvrx_independent  # no launcher: two processes, the memory tier and the replica wire
def test_fsdp2_rank_of_a_lost_node_restores_its_shards_from_the_buddys_copy(tmp_path: Path) -> None:
    """Two "nodes" of one rank each, FSDP2 + AdamW sharded across them, snapshots replicated to the
    buddy. Node 1 is lost: its shared memory (its rank's snapshots and the copies it kept of node 0)
    is gone and a new replica server starts there empty. The new processes agree on step 4: rank 0
    from its own memory, rank 1 from node 0's copy of its shards (tier "buddy"), each rank's model and
    AdamW shards bitwise as they were at step 4, and step 5 again bitwise the fault-free run's."""
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy for object collectives")
    from resctl.checkpoint import replica
    from resctl.telemetry.events import read_events
    from tests.unit.test_checkpoint_replica import KEY, _addr, _run_ranks

    roots = [tmp_path / "shm-0", tmp_path / "shm-1"]
    for r in roots:
        r.mkdir()
    servers = [replica.ReplicaServer(KEY, 0, host="127.0.0.1", root=r) for r in roots]
    try:
        script = tmp_path / "worker.py"
        script.write_text(FSDP_BUDDY_WORKER)
        _run_ranks(script, tmp_path, "train", servers, roots)
        assert sorted(p.step for p in replica.listing(_addr(servers[0]), KEY, 1)) == [2, 4]
        assert not (tmp_path / "ck").exists() or not list((tmp_path / "ck").glob("step-*"))  # memory only
        servers[1].close()  # node 1 lost: its server, its own snapshots and the copies it kept
        shutil.rmtree(roots[1])
        roots[1] = tmp_path / "shm-1-new"  # the node that takes its place
        roots[1].mkdir()
        servers[1] = replica.ReplicaServer(KEY, 0, host="127.0.0.1", root=roots[1])
        outs = _run_ranks(script, tmp_path, "resume", servers, roots)
    finally:
        for s in servers:
            s.close()
    assert all(f"ok {r} resume" in out for r, out in enumerate(outs)), outs
    loads = {e["rank"]: e for e in read_events(tmp_path / "ev-resume") if e["kind"] == "ckpt_load"}
    assert (loads[0]["tier"], loads[1]["tier"]) == ("memory", "buddy"), loads
    assert loads[0]["step"] == loads[1]["step"] == 4, loads


OFF_HOST = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.filterwarnings("ignore")
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    from resctl.checkpoint import Checkpointer

    dist.init_process_group("gloo")
    # The state's mesh is not on the host's device (a GPU's, absent here: "meta" stands in), its shard in host memory
    mesh = DeviceMesh("meta", torch.tensor([0]), _init_backend=False)
    spec = DTensor.from_local(torch.empty(4, 3, device="meta"), mesh, [Shard(0)], run_check=False)._spec
    full = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    w = DTensor(full.clone(), spec, requires_grad=False)
    ck = Checkpointer(dir=sys.argv[1], writers=1, keep_last=3)
    for step in (1, 2, 3):
        ck.save({"w": {"weight": w}}, step)
        ck.wait()
        w.to_local().add_(100.0)
    w.to_local().zero_()
    assert ck.load({"w": {"weight": w}}) == 3
    assert torch.equal(w.to_local(), full + 200.0), w.to_local()  # step 3's bytes, not step 1's
    dist.destroy_process_group()
    os._exit(0)
    """
)


def test_shards_of_a_mesh_on_another_device_are_written_from_the_host_copy_at_every_save(tmp_path: Path) -> None:
    """The staged DTensors stand over the host copy whatever the mesh's device: `DTensor.from_local` moved them to
    it (on a GPU: a device copy of the whole state at the first save, which the kept wrappers then wrote at every
    later save; here the move loses the bytes)."""
    pytest.importorskip("numpy", reason="torch.distributed.checkpoint needs numpy for object collectives")
    script = tmp_path / "off_host.py"
    script.write_text(OFF_HOST)
    port = free_port()
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
               OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH", "")])))
    proc = zygote().run([sys.executable, str(script), str(tmp_path / "ck")], env=env, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
