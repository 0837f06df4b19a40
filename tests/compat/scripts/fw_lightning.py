"""Contract: a PyTorch Lightning Trainer (DDP, gloo, CPU) with ModelCheckpoint every 10 steps resumes from
`ckpt_path="last"`; with a third argument K, rank 1 of the first attempt is SIGKILLed at step K."""
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


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


class Probe(L.Callback):
    def on_train_start(self, trainer, module):
        sys.stdout.write(f"FACT rank={RANK} attempt={ATTEMPT} start_step={trainer.global_step}\n")

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        step_begins(trainer.global_step)


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4, shuffle=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Tiny()
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=os.path.join(OUT, "ckpt"), filename="{step}",
                                               every_n_train_steps=EVERY, save_top_k=-1, save_last=True)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=STEPS, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[ckpt, Probe()])
    trainer.fit(model, data(), ckpt_path="last")
    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    sys.stdout.write(f"FACT rank={RANK} steps={trainer.global_step} checksum={checksum:.12g}\n")
