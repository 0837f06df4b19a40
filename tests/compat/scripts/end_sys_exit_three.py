"""Contract: sys.exit(3) on every rank fails the job with torchrun's exit code."""
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} ending=sys.exit(3)\n")
sys.stdout.flush()
Path(sys.argv[1], f"rank{RANK}").touch()  # both ranks printed before either ends: none is stopped early
while not all(Path(sys.argv[1], f"rank{r}").exists() for r in (0, 1)):
    time.sleep(0.02)
sys.exit(3)
