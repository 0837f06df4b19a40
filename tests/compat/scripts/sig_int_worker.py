"""Contract: SIGINT sent to a worker raises KeyboardInterrupt in it; the script's cleanup runs, exit 0."""
import os
import sys
import time

RANK = int(os.environ["RANK"])
sys.stdout.write(f"READY rank={RANK} pid={os.getpid()}\n")
sys.stdout.flush()
try:
    time.sleep(30)
    sys.stdout.write(f"FACT rank={RANK} interrupted=False\n")
except KeyboardInterrupt:
    sys.stdout.write(f"FACT rank={RANK} interrupted=True\n")
