"""How long a checkpoint save holds the training loop: FSDP2 or DDP, saved by resctl.checkpoint or by the
script's own synchronous `torch.distributed.checkpoint.save` (bench/bench_fsdp_save.py runs it under torchrun
and under `resctl run`, alternating).

    torchrun --nproc-per-node 2 bench/scripts/fsdp_stall.py --model fsdp2 --save resctl --dir /tmp/ck

The model is `--layers` x Linear(width, width) + AdamW (8 x 2048: 134 MB of parameters, 403 MB with Adam's
moments), wrapped by `fully_shard` on each layer and the model (FSDP2) or by DDP. A save every `--interval`
steps; each save's seconds in the loop (the call, to its return) are the stall. Rank 0 prints one line
`STALL {json}`: the stalls (the first apart: it allocates the host copies), the median step time without a
save, and the seconds of one copy of this rank's state to host memory (pinned on a GPU) into preallocated
buffers: what a save that stages before it returns cannot beat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def build(model_kind: str, layers: int, width: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    if model_kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def local_tensors(state: dict) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def walk(obj: object) -> None:
        if isinstance(obj, torch.Tensor):
            out.append(obj.to_local() if hasattr(obj, "to_local") else obj)
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(state)
    return out


def copy_seconds(tensors: list[torch.Tensor], sync) -> float:
    """The best of 3 copies of `tensors` into preallocated host buffers (pinned when on a GPU)."""
    pin = any(t.is_cuda for t in tensors)
    bufs = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in tensors]
    best = float("inf")
    for _ in range(3):
        sync()
        t0 = time.perf_counter()
        for b, t in zip(bufs, tensors):
            b.copy_(t, non_blocking=pin)
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def profiled(call) -> None:
    """`call` under cProfile; its top 30 functions by cumulative time to stderr."""
    import cProfile
    import io
    import pstats
    import sys

    prof = cProfile.Profile()
    prof.runcall(call)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
    print("PROFILE OF A SAVE\n" + out.getvalue(), file=sys.stderr, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["fsdp2", "ddp"], default="fsdp2")
    ap.add_argument("--save", choices=["resctl", "dcp", "none"], default="resctl")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--dir", default="ck-stall")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds of pretend compute (sleep) per step")
    ap.add_argument("--memory-every", type=int, default=0, help="without resctl run: checkpoint.memory_every")
    ap.add_argument("--split-wait", action="store_true",
                    help="resctl: wait for the previous write first (timed apart: `waited_s`), so the stall is the staging")
    ap.add_argument("--profile-save", type=int, default=0, metavar="N",
                    help="cProfile the Nth save call (with the device synchronized inside) and print its top functions "
                         "by cumulative time to stderr (rank 0)")
    ap.add_argument("--restore", action="store_true", help="after the loop: time a load (resctl: memory tier or disk)")
    args = ap.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank = dist.get_rank()
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    model = build(args.model, args.layers, args.width, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if args.save == "dcp":  # DCP's own way: fully qualified names, optimizer state keyed by them
        from torch.distributed.checkpoint.state_dict import get_state_dict

        def state_of() -> dict:
            msd, osd = get_state_dict(model, opt)
            return {"model": msd, "optim": osd}
    else:  # resctl's: the objects, saved through their state_dict() (DTensors for FSDP2)
        def state_of() -> dict:
            return {"model": model, "optim": opt}

    if args.save == "resctl":
        import resctl.checkpoint as ckpt

        if "RESCTL_PLAN" not in os.environ and "RESCTL_RUN_DIR" not in os.environ:
            ckpt.configure(dir=args.dir, interval_steps=args.interval, memory_every=args.memory_every)
    x = torch.randn(args.batch, args.width, device=device)
    steps, stalls, waits = [], [], []
    loop0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()
        sync()
        if args.step_time:
            time.sleep(args.step_time)
        t1 = time.perf_counter()
        if step % args.interval == 0 and args.save != "none":
            if args.save == "resctl":
                if args.split_wait:
                    ckpt.wait()
                    waits.append(time.perf_counter() - t1)
                    t1 = time.perf_counter()
                if args.profile_save and len(stalls) + 1 == args.profile_save and rank == 0:
                    profiled(lambda: (ckpt.maybe_save(state_of(), step), sync()))
                else:
                    ckpt.maybe_save(state_of(), step)
            else:
                import torch.distributed.checkpoint as dcp

                dcp.save(state_of(), checkpoint_id=os.path.join(args.dir, f"step-{step}"))
            sync()
            stalls.append(time.perf_counter() - t1)
        else:
            steps.append(t1 - t0)
    loop_s = time.perf_counter() - loop0
    if args.save == "resctl":
        ckpt.wait()
    restore = None
    if args.restore and args.save == "resctl":
        # The state as saved last (the loop ends on a save step), then wiped: the load must put every byte back.
        live = local_tensors({"model": model.state_dict(), "optim": opt.state_dict()})
        want = [t.clone() for t in live]
        for t in live:
            t.zero_()
        sync()
        t0 = time.perf_counter()
        restored = ckpt.load(state_of())
        sync()
        seconds = time.perf_counter() - t0
        now = local_tensors({"model": model.state_dict(), "optim": opt.state_dict()})
        exact = len(now) == len(want) and all(torch.equal(a, b) for a, b in zip(now, want))
        restore = {"step": restored, "seconds": round(seconds, 4), "exact": exact}
        del want
    copy = copy_seconds(local_tensors({"model": model.state_dict(), "optim": opt.state_dict()}), sync)
    if rank == 0:
        steady = stalls[1:] or stalls
        print("STALL " + json.dumps({
            "model": args.model, "save": args.save, "world": dist.get_world_size(),
            "first_s": round(stalls[0], 4) if stalls else None,
            "stall_p50_s": round(statistics.median(steady), 4) if steady else None,
            "stalls_s": [round(s, 4) for s in stalls],
            "waited_s": [round(s, 4) for s in waits],
            "step_p50_s": round(statistics.median(steps), 4),
            "copy_s": round(copy, 4),
            "loop_s": round(loop_s, 3),
            "efficiency": round((sum(steps) + len(stalls) * statistics.median(steps)) / loop_s, 4),
            # the first save apart (it allocates and pins the host copies once a job): a long job's efficiency
            "efficiency_steady": round((sum(steps) + len(stalls) * statistics.median(steps))
                                       / (loop_s - stalls[0] + statistics.median(steady)), 4) if stalls else None,
            "restore": restore,
        }), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
