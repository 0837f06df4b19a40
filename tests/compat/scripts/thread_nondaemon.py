"""Contract: the interpreter waits for a non-daemon thread at exit; a daemon thread is cut off."""
import os
import sys
import threading
import time

RANK = int(os.environ["RANK"])


def late(what, delay):
    time.sleep(delay)
    sys.stdout.write(f"THREAD rank={RANK} {what} thread finished\n")
    sys.stdout.flush()


threading.Thread(target=late, args=("non-daemon", 0.5)).start()
threading.Thread(target=late, args=("daemon", 30), daemon=True).start()
sys.stdout.write(f"OUT rank={RANK} main returns\n")
sys.stdout.flush()
