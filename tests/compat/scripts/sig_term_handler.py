"""Contract: a SIGTERM handler the script installs fires when SIGTERM is sent to the worker; the script
then ends normally (exit 0)."""
import os
import signal
import sys
import time

RANK = int(os.environ["RANK"])
got = []


def handler(signum, frame):
    sys.stdout.write(f"HANDLER rank={RANK} {signal.Signals(signum).name}\n")
    sys.stdout.flush()
    got.append(signum)


signal.signal(signal.SIGTERM, handler)
sys.stdout.write(f"READY rank={RANK} pid={os.getpid()}\n")
sys.stdout.flush()
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    time.sleep(0.05)
sys.stdout.write(f"FACT rank={RANK} handled={bool(got)}\n")
