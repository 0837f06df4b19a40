"""Waits for a signal; a KeyboardInterrupt, and a SIGUSR1 handler the script set, are reported."""
import os
import signal
import sys
import time

rank = int(os.environ["RANK"])
signal.signal(signal.SIGUSR1, lambda *_: print(f"FACT usr1 rank {rank}", flush=True))
if sys.argv[1] == "term0":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print(f"READY {os.getpid()}", flush=True)
try:
    for _ in range(600):
        time.sleep(0.1)
except KeyboardInterrupt:
    print(f"FACT KeyboardInterrupt rank {rank}", flush=True)
    raise
