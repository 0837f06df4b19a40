"""Contract: a transformers Trainer (a tiny GPT-2 built from its config, CPU, gloo) saves every 10 steps
and resumes with resume_from_checkpoint; with a third argument K, rank 1 of the first attempt is SIGKILLed
at step K."""
import os
import signal
import sys  # FACT lines in one write each: a line another rank cannot split
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_callback import PrinterCallback
from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging as hf_logging

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


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(0, 64, (64, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Probe(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        sys.stdout.write(f"FACT rank={RANK} attempt={ATTEMPT} start_step={state.global_step}\n")

    def on_step_begin(self, args, state, control, **kwargs):
        step_begins(state.global_step)


if __name__ == "__main__":
    hf_logging.disable_progress_bar()  # its bars carry timings: the console would differ from run to run
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=8, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(output_dir=OUT, max_steps=STEPS, save_steps=EVERY, per_device_train_batch_size=4,
                             learning_rate=0.05, seed=0, report_to="none", use_cpu=True, ddp_backend="gloo",
                             disable_tqdm=True, logging_strategy="no", dataloader_num_workers=0,
                             ddp_find_unused_parameters=False)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Probe()])
    trainer.remove_callback(PrinterCallback)
    trainer.train(resume_from_checkpoint=get_last_checkpoint(OUT) if os.path.isdir(OUT) else None)
    checksum = sum(float(p.detach().double().sum()) for p in trainer.model.parameters())
    sys.stdout.write(f"FACT rank={RANK} steps={trainer.state.global_step} checksum={checksum:.12g}\n")
