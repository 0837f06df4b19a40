"""Contract: SIGINT to the launcher alone: what reaches the workers (and the exit code) is torchrun's."""
import os
import signal
import sys
import time

RANK = int(os.environ["RANK"])
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append("SIGTERM"))
sys.stdout.write(f"READY rank={RANK} pid={os.getpid()}\n")
sys.stdout.flush()
try:
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
except KeyboardInterrupt:
    got.append("KeyboardInterrupt")
sys.stdout.write(f"FACT rank={RANK} got={got}\n")
