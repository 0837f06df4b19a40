"""Contract: Ctrl-C (SIGINT to the whole foreground process group) raises KeyboardInterrupt in every worker;
the script's `except KeyboardInterrupt:` cleanup runs; the job ends with torchrun's exit code."""
import os
import sys
import time

RANK = int(os.environ["RANK"])
sys.stdout.write(f"READY rank={RANK} pid={os.getpid()}\n")
sys.stdout.flush()
try:
    time.sleep(30)
    sys.stdout.write(f"FACT rank={RANK} cleanup=not interrupted\n")
except KeyboardInterrupt:
    sys.stdout.write(f"FACT rank={RANK} cleanup=ran\n")
    sys.stdout.flush()
