"""Contract: torch.compile of a tiny function (dynamo + AOT autograd) works and gives the eager result."""
import os
import sys

import torch

RANK = int(os.environ["RANK"])


def f(x):
    return torch.sin(x) * 2 + x


compiled = torch.compile(f, backend="aot_eager")  # dynamo + AOT autograd; inductor would add a C++ build
x = torch.arange(4.0)
sys.stdout.write(f"FACT rank={RANK} equal={torch.allclose(compiled(x), f(x))}\n")
