"""The phases a stop can land in (issue 32): tests/integration/test_stop_phases.py and bench/bench_stop_phases.py.

Env: MARKS (a directory), PHASE (fork, refork, import, init, restore, train). Writes `<phase>-<rank>-<pid>` into
MARKS when it enters a phase, then stays there (a slow import, a peer that never comes, a restore that takes
long); the training phase steps with a checkpoint due every step. Runs the same under torchrun.
"""

import os
import pathlib
import sys
import time

MARKS, PHASE, RANK = pathlib.Path(os.environ["MARKS"]), os.environ["PHASE"], int(os.environ["RANK"])


def mark(name: str) -> None:
    (MARKS / f"{name}-{RANK}-{os.getpid()}").touch()


class SlowRestore:
    """A state entry whose restore takes long (slow storage)."""

    def state_dict(self) -> dict:
        import torch

        return {"w": torch.zeros(4)}

    def load_state_dict(self, _sd: dict) -> None:
        mark("restore")
        time.sleep(600)


def main() -> None:
    mark("pid")
    if PHASE == "refork" and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        sys.exit(1)  # the launcher restarts the workers: the stop lands while it forks the new ones
    if PHASE == "import":
        mark("import")
        time.sleep(600)  # a slow import
    import torch
    import torch.distributed as dist

    import resctl.checkpoint as ckpt

    if PHASE == "init":
        if RANK == 1:
            time.sleep(600)  # never comes: rank 0 waits in init_process_group
        mark("init")
    dist.init_process_group("gloo")
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if PHASE == "restore":
        ckpt.save({"model": model, "slow": SlowRestore()}, 1)
        ckpt.wait()
        ckpt.load({"model": model, "slow": SlowRestore()})
    step = 0
    while True:
        step += 1
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        ckpt.maybe_save({"model": model, "opt": opt}, step)
        if step == 5:
            mark("train")
        time.sleep(0.02)


if __name__ == "__main__":
    main()
