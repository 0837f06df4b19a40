"""What a fresh worker process would have, restored before each in-process restart.

An in-job restart re-runs the script in a new process (forked from the launcher, so every worker
starts from the same memory). An in-process restart re-runs it in the *same* interpreter, where
process-wide state left by the failed iteration would otherwise change the result:

- the global random generators (Python's `random`, NumPy's legacy global, torch's CPU generator)
  a script that does not seed them all draws different numbers on the second run;
- torch's CUDA default generators: back to their seed and offset 0, as a new process has them;
- DTensor's RNG tracker (`torch.distributed.tensor._random._rng_tracker`), a module global created on
  the first random DTensor op (FSDP2's `reset_parameters()` on sharded parameters, for one) that
  advances its own offsets and is *not* reset by `torch.manual_seed`: a model initialised again after
  a restart got different parameters;
- TorchDynamo's caches (compiled frames keep guards and automatic-dynamic decisions from the failed
  iteration, so a re-compiled model may pick other kernels).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from typing import Any

from resctl.patching import Patches


@dataclass
class FreshState:
    python_random: Any
    numpy_random: Any
    torch_cpu: Any
    default_seed: int

    @classmethod
    def capture(cls) -> "FreshState":
        import torch

        numpy = sys.modules.get("numpy")
        return cls(
            python_random=random.getstate(),
            numpy_random=numpy.random.get_state() if numpy is not None else None,
            torch_cpu=torch.get_rng_state(),
            default_seed=torch.Generator().initial_seed(),  # what a new process seeds every generator with
        )

    def restore(self) -> list[str]:
        """Put the process back as a new worker would find it; returns what was reset."""
        import torch

        done = ["random", "torch.cpu"]
        random.setstate(self.python_random)
        torch.set_rng_state(self.torch_cpu)
        numpy = sys.modules.get("numpy")
        if numpy is not None and self.numpy_random is not None:
            numpy.random.set_state(self.numpy_random)
            done.append("numpy")
        if torch.cuda.is_initialized():
            for generator in torch.cuda.default_generators:
                generator.manual_seed(self.default_seed)
            done.append("torch.cuda")
        dtensor_random = sys.modules.get("torch.distributed.tensor._random")
        if dtensor_random is not None and getattr(dtensor_random, "_rng_tracker", None) is not None:
            # through Patches as every change to torch is; never undone: the failed iteration's tracker must not return
            Patches("shim.fresh").set(dtensor_random, "_rng_tracker", None)
            done.append("dtensor rng tracker")
        if "torch._dynamo" in sys.modules:
            torch._dynamo.reset()
            done.append("dynamo")
        return done
