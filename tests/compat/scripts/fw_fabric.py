"""Contract: a Lightning Fabric loop (DDP, gloo, CPU) saves with fabric.save every 10 steps and resumes
with fabric.load; with a third argument K, rank 1 of the first attempt is SIGKILLed at step K."""
import os
import signal
import sys  # FACT lines in one write each: a line another rank cannot split
import time

import lightning as L
import torch
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


if __name__ == "__main__":
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True))
    path = os.path.join(OUT, "fabric.ckpt")
    state = {"model": model, "optimizer": optimizer, "step": 0, "epoch": 0}
    if os.path.exists(path):
        fabric.load(path, state)
    step, epoch = state["step"], state["epoch"]
    sys.stdout.write(f"FACT rank={RANK} attempt={ATTEMPT} start_step={step}\n")
    while step < STEPS:
        loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            step_begins(step)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            step += 1
            if step % EVERY == 0:
                state.update(step=step, epoch=epoch)
                fabric.save(path, state)
            if step == STEPS:
                break
        else:
            epoch += 1
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    sys.stdout.write(f"FACT rank={RANK} steps={step} checksum={checksum:.12g}\n")
