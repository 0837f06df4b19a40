"""Make a forked worker see what an exec'd one (torchrun's) gets from its environment.

Under `launch.worker_start = "fork"` the launcher imported torch (`preload`) before it set the
per-worker environment, so whatever torch and its libraries read once at load time was read with
the launcher's values, not the worker's. What torchrun gives a worker through the environment, and
whether it still takes effect in a forked one:

- `OMP_NUM_THREADS`: the launcher sets it to 1 when more than one worker shares a node. libgomp
  reads it when it is loaded (with torch), so a forked worker kept the launcher's (all cores):
  applied here with `torch.set_num_threads`, which also sizes MKL's pool, as torchrun's would be.
- `MKL_NUM_THREADS`: not set by torchrun; a user's value is in the launcher's environment before
  it imports torch, so a forked worker has it already.
- `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`/`PORT`, `TORCHELASTIC_*`, `TORCH_NCCL_*`,
  `NCCL_*`: read when the process group is made (after the fork): nothing to do.
- `CUDA_VISIBLE_DEVICES`: read when CUDA initialises, which the launcher never does (`preload`
  checks): a worker's own value takes effect.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping


def omp_threads(env: Mapping[str, str]) -> int | None:
    """The thread count `OMP_NUM_THREADS` asks for (a positive int; None when absent or not one,
    as libgomp ignores what it cannot parse)."""
    raw = env.get("OMP_NUM_THREADS", "").strip().split(",")[0]
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def apply(env: Mapping[str, str] = os.environ) -> None:
    """In a worker forked after torch was imported: size torch's intra-op pool as the worker's
    environment says. A no-op in an exec'd worker (torch not imported yet: it reads the variable
    itself) and when the value already holds."""
    torch = sys.modules.get("torch")
    wanted = omp_threads(env)
    if torch is None or wanted is None or torch.get_num_threads() == wanted:
        return
    torch.set_num_threads(wanted)
