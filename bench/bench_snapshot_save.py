"""The save call of an FSDP2 state at a step that takes a memory snapshot and a disk checkpoint, the disk
one written from the snapshot's bytes (issue 41): how long the loop is blocked, and the part of it spent in
the sharded save's staging (`sharded.Saver.stage`: no copy here, only DTensor wrappers of the slot's views).
One gloo rank on CPU, a model of many small layers, so the per-tensor work shows (a real model: hundreds of
parameters, three DTensors each with AdamW).

    python bench/bench_snapshot_save.py --layers 40 --width 64

Prints the median over the saves after the first two (one per slot) of the save call and of its stage.
Compare two trees by running each with its own PYTHONPATH, alternating.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from typing import Any


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--steps", type=int, default=42, help="a snapshot and a disk save every 2 steps")
    ap.add_argument("--port", type=int, default=29791)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port), RANK="0", WORLD_SIZE="1")
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from resctl.checkpoint import Checkpointer, sharded

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1,))
    model = nn.Sequential(*[nn.Linear(args.width, args.width) for _ in range(args.layers)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tmp = tempfile.mkdtemp(prefix="bench-snapshot-save-")
    os.makedirs(f"{tmp}/shm")
    os.environ["RESCTL_SHM_DIR"] = f"{tmp}/shm"
    ck = Checkpointer(dir=f"{tmp}/ck", memory_every=2, interval_steps=2, run_id="bench")
    state = {"model": model, "optim": opt}
    staged: list[float] = []
    stage = sharded.Saver.stage

    def timed(self: Any, *a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return stage(self, *a, **k)
        finally:
            staged.append(time.perf_counter() - t0)

    sharded.Saver.stage = timed  # type: ignore[method-assign]
    calls: list[float] = []
    for i in range(1, args.steps + 1):
        opt.zero_grad()
        model(torch.randn(4, args.width)).square().mean().backward()
        opt.step()
        t0 = time.perf_counter()
        ck.maybe_save(state, i)
        if i % 2 == 0:
            calls.append(time.perf_counter() - t0)
            ck.wait()
    tensors = 3 * len(list(model.parameters()))
    print(f"{tensors} DTensors, {len(calls) - 2} saves: save call p50 {statistics.median(calls[2:]) * 1e3:.2f} ms, "
          f"sharded stage p50 {statistics.median(staged[2:]) * 1e3:.2f} ms", flush=True)
    ck.release_memory()
    ck.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
