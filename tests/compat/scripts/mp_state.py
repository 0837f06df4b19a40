"""Contract: multiprocessing sees the worker as a main process: its name, no parent, no start method set."""
import multiprocessing as mp
import os
import sys

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} current_process={mp.current_process().name}\n")
sys.stdout.write(f"FACT rank={RANK} parent_process={mp.parent_process()}\n")
sys.stdout.write(f"FACT rank={RANK} start_method={mp.get_start_method(allow_none=True)}\n")
sys.stdout.write(f"FACT rank={RANK} active_children={len(mp.active_children())}\n")
sys.stdout.write(f"FACT rank={RANK} daemon={mp.current_process().daemon}\n")
