"""Contract: an accelerate loop (CPU, 2 processes, gloo) saves with save_state every 10 steps and resumes
with load_state and skip_first_batches; with a third argument K, rank 1 of the first attempt is SIGKILLed
at step K."""
import os
import signal
import sys  # FACT lines in one write each: a line another rank cannot split
import time

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
OUT = sys.argv[1]
KILL_AT = int(sys.argv[2]) if len(sys.argv) > 2 else 0
STEPS, EVERY = 30, 10


def step_begins(step):
    """Rank 1 of the first attempt dies at KILL_AT; a later attempt notes when it trains again."""
    if not KILL_AT:
        return
    if RANK == 1 and ATTEMPT == 0 and step == KILL_AT:
        mark("killed")
        os.kill(os.getpid(), signal.SIGKILL)
    if RANK == 0 and ATTEMPT > 0 and not os.path.exists(os.path.join(OUT, "resumed.t")):
        mark("resumed")


def mark(what):
    """When the kill came and when a later attempt trains again (bench/bench_frameworks.py reads them)."""
    with open(os.path.join(OUT, f"{what}.t"), "w") as f:
        f.write(repr(time.time()))


def latest(out):
    steps = [int(d.split("_")[1]) for d in os.listdir(out) if d.startswith("step_")] if os.path.isdir(out) else []
    return max(steps, default=0)


if __name__ == "__main__":
    # a seedable sampler: each epoch's order from (seed, epoch), so a resumed epoch is the same epoch
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    per_epoch = len(loader)
    step = latest(OUT)
    if step:
        accelerator.load_state(os.path.join(OUT, f"step_{step}"))
    sys.stdout.write(f"FACT rank={RANK} attempt={ATTEMPT} start_step={step}\n")
    epoch, skip = divmod(step, per_epoch)
    while step < STEPS:
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        batches.set_epoch(epoch)  # a skipping loader is a new one: its epoch too
        skip = 0
        for xb, yb in batches:
            step_begins(step)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            step += 1
            if step % EVERY == 0:
                accelerator.save_state(os.path.join(OUT, f"step_{step}"))
            if step == STEPS:
                break
        epoch += 1
    checksum = sum(float(p.detach().double().sum()) for p in accelerator.unwrap_model(model).parameters())
    sys.stdout.write(f"FACT rank={RANK} steps={step} checksum={checksum:.12g}\n")
