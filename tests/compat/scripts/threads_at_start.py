"""Contract: the script starts with one thread (MainThread), as in a fresh interpreter."""
import os
import sys
import threading

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} active_count={threading.active_count()}\n")
sys.stdout.write(f"FACT rank={RANK} names={sorted(t.name for t in threading.enumerate())}\n")
sys.stdout.write(f"FACT rank={RANK} main_is_current={threading.current_thread() is threading.main_thread()}\n")
