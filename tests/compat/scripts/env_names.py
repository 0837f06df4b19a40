"""Contract: the launcher-made variables a torchrun worker sees, by name: none missing, none added."""
import os
import sys

RANK = int(os.environ["RANK"])
PREFIXES = ("TORCH", "MASTER_", "RANK", "LOCAL_", "WORLD_", "GROUP_", "ROLE_", "OMP_", "MKL_", "PYTHON", "CUDA",
            "NCCL", "GLOO", "NVIDIA", "KMP_", "DMLC", "LD_", "TMP", "TEMP")
names = sorted(n for n in os.environ if n.startswith(PREFIXES))
sys.stdout.write(f"FACT rank={RANK} count={len(names)}\n")
for name in names:
    sys.stdout.write(f"FACT rank={RANK} {name}=set\n")
