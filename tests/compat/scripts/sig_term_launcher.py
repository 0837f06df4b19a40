"""Contract: SIGTERM to the launcher reaches the workers' SIGTERM handler; the job's exit code is torchrun's
(a stopped job is not a success even when the workers end with 0)."""
import os
import signal
import sys
import time

RANK = int(os.environ["RANK"])
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
sys.stdout.write(f"READY rank={RANK} pid={os.getpid()}\n")
sys.stdout.flush()
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
sys.stdout.write(f"FACT rank={RANK} got_sigterm={bool(got)}\n")
