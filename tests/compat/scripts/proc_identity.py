"""Contract: the worker's process looks like torchrun's: its own pid, the launcher's process group, its name."""
import os
import sys

RANK = int(os.environ["RANK"])
with open("/proc/self/comm") as fh:
    comm = fh.read().strip()
sys.stdout.write(f"FACT rank={RANK} comm={comm}\n")
sys.stdout.write(f"FACT rank={RANK} leads_group={os.getpgrp() == os.getpid()}\n")
sys.stdout.write(f"FACT rank={RANK} parent_leads_group={os.getpgid(os.getppid()) == os.getpgrp()}\n")
sys.stdout.write(f"FACT rank={RANK} ~pid={os.getpid()}\n")
