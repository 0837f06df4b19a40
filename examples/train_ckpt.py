"""Deterministic data-parallel CPU training with `resctl.checkpoint` — the recovery drills' workload.

Runs three ways, unchanged:

    python examples/train_ckpt.py --steps 50 --out final.pt                  # one process, no resctl
    torchrun --nproc-per-node 2 examples/train_ckpt.py --out final.pt        # plain torchrun (gloo)
    resctl run -p examples/profiles/local-cpu.toml examples/train_ckpt.py --out final.pt

Everything that decides the result is a pure function of its inputs: parameters come from a fixed
seed, the batch of a step is generated from `(step, rank)` alone, the model has no randomness
(no dropout), and gradients are averaged in one all-reduce over a fixed layout, so gloo adds
them in the same order for a given world size. So a run that was killed,
restarted and resumed from its newest checkpoint ends with a model *and* Adam state bitwise equal
to a run that never failed — which is what tests/integration/test_recovery.py checks.

Checkpoints: `resctl.checkpoint.load(state)` restores the newest valid checkpoint (0 when none),
`maybe_save(state, step)` runs after every step (the profile's `checkpoint.interval_steps` decides),
`wait()` makes the last write durable. Under `resctl run` the shim configures the checkpointer from
the profile; without resctl, `--ckpt-dir` / `--save-every` configure it here.

`--out PATH` (rank 0) writes `{"model": ..., "optim": ..., "step": N}` with torch.save at the end.
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import resctl.checkpoint as checkpoint


def batch(step: int, rank: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data of `step` on `rank`: a pure function of both, so a replayed step sees the same batch."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(16, width, generator=g)
    return x, (x[:, : width // 2].sum(dim=1, keepdim=True)).tanh()


def build_model(width: int) -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(width, 2 * width), nn.Tanh(), nn.Linear(2 * width, 1))


def average_gradients(model: nn.Module, world: int) -> None:
    """Data-parallel gradient averaging in one all-reduce over a fixed flat layout.

    Not DDP on purpose: DDP re-buckets gradients by arrival order after its first iteration, and
    the bucket layout decides how gloo's ring all-reduce splits the sum into chunks. With more than
    two ranks a different split adds the same numbers in a different order, so a run resumed from a
    checkpoint (whose first step uses the initial buckets) would differ in the last bits from one
    that never stopped. One flat buffer in parameter order gives the same sums every time.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset: offset + g.numel()].view_as(g))
        offset += g.numel()


def parse_sigterm_at(text: str) -> dict[tuple[int, int], float]:
    """`--sigterm-at 20:1@0.5,21:0` -> {(20, 1): 0.5, (21, 0): 0.0}."""
    out: dict[tuple[int, int], float] = {}
    for item in filter(None, text.split(",")):
        where, _, delay = item.partition("@")
        step, _, rank = where.partition(":")
        out[(int(step), int(rank or 0))] = float(delay or 0)
    return out


class SlowToSave:
    """A state entry whose `state_dict()` takes `seconds` (a rank with a larger shard, or slower storage)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def state_dict(self) -> dict[str, float]:
        time.sleep(self.seconds)
        return {"seconds": self.seconds}

    def load_state_dict(self, sd: dict[str, float]) -> None:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=50, help="train until this optimizer step")
    ap.add_argument("--width", type=int, default=8, help="model width (tiny by default)")
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--step-time", type=float, default=0.0, help="seconds of pretend compute per step")
    ap.add_argument("--out", default="", help="rank 0 writes the final model+optimizer state here")
    ap.add_argument("--ckpt-dir", default="", help="without resctl: checkpoint directory (default ./checkpoints)")
    ap.add_argument("--save-every", type=int, default=0, help="without resctl: checkpoint interval in steps")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (each rank uses GPU LOCAL_RANK)")
    ap.add_argument("--backend", default="", help="process group backend (default: gloo on cpu, nccl on cuda); "
                    "given explicitly, a group is made even for one rank")
    ap.add_argument("--block-sigterm", action="store_true",
                    help="block SIGTERM in the main thread, as a rank stuck in native code (an NCCL wait, a CUDA "
                    "sync) effectively does: only the default action or another thread can stop it")
    ap.add_argument("--stall-at", default="", metavar="STEP:RANK",
                    help="first launcher cycle only: RANK sleeps in native code after STEP, as a rank whose peer "
                    "died sits in a collective that never completes")
    ap.add_argument("--sigterm-at", default="", metavar="STEP:RANK[@SECONDS],...",
                    help="RANK sends itself SIGTERM in STEP, after the gradient all-reduce and before the step "
                    "boundary, SECONDS after the all-reduce (a stop signal that reaches the ranks at different steps)")
    ap.add_argument("--save-time", default="", metavar="RANK@SECONDS",
                    help="every checkpoint save on RANK takes SECONDS longer (a rank with a larger shard)")
    ap.add_argument("--hold-until", default="", metavar="PATH",
                    help="a run that starts from step 0 waits for PATH to exist before its first step (a test "
                    "brings up another node meanwhile)")
    args = ap.parse_args()
    sigterms = parse_sigterm_at(args.sigterm_at)
    stall_step, _, stall_rank = args.stall_at.partition(":")
    stall = (int(stall_step), int(stall_rank or 0)) if stall_step else None
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        stall = None
    if args.block_sigterm:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
        torch.use_deterministic_algorithms(True)  # with CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1 or bool(args.backend)
    if distributed:
        dist.init_process_group(args.backend or ("nccl" if device.type == "cuda" else "gloo"))
    rank = dist.get_rank() if distributed else 0
    if args.ckpt_dir or args.save_every:
        # Only when asked: under resctl the shim has already configured the checkpointer from the profile.
        checkpoint.configure(dir=args.ckpt_dir or "checkpoints", interval_steps=args.save_every or 100)

    model = build_model(args.width).to(device)
    world = dist.get_world_size() if distributed else 1
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    state = {"model": model, "optim": opt}
    slow_rank, _, slow_seconds = args.save_time.partition("@")
    if slow_rank:  # on every rank (one structure), slow on one
        state["slow"] = SlowToSave(float(slow_seconds) if int(slow_rank) == rank else 0.0)
    start = checkpoint.load(state)
    if start:
        print(f"[rank {rank}] resumed from checkpoint step {start}\n", end="", flush=True)  # one write per line

    while args.hold_until and not start and not os.path.exists(args.hold_until):
        time.sleep(0.05)
    loss = torch.zeros(())
    for step in range(start + 1, args.steps + 1):
        x, y = (t.to(device) for t in batch(step, rank, args.width))
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if distributed:
            average_gradients(model, world)
        opt.step()
        if (step, rank) in sigterms and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
            time.sleep(sigterms[(step, rank)])
            os.kill(os.getpid(), signal.SIGTERM)
        if args.step_time:
            time.sleep(args.step_time)
        if stall == (step, rank):
            time.sleep(3600)
        checkpoint.maybe_save(state, step)
        if rank == 0 and step % 10 == 0:
            print(f"[rank 0] step {step} loss {loss.item():.6f}", flush=True)
    checkpoint.wait()
    if distributed:
        dist.barrier()
    if rank == 0 and args.out:
        tmp = args.out + ".tmp"
        torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": args.steps}, tmp)
        os.replace(tmp, args.out)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
