"""A worker that imports torch and prints one line: what `bench_launch.py` waits for."""

import torch  # noqa: F401  (a real script imports torch before anything else)

print("WORKER-UP", flush=True)
