"""A no-op job: one line per rank (bench/bench_happy_path.py)."""

import os

print(f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}: nothing to do", flush=True)
