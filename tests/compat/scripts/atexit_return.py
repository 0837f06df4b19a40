"""Contract: atexit handlers run when the script returns (e.g. a logger's flush)."""
import atexit
import os
import sys

RANK = int(os.environ["RANK"])
atexit.register(lambda: sys.stdout.write(f"ATEXIT rank={RANK} flushed\n"))
sys.stdout.write(f"OUT rank={RANK} main done\n")
