"""Contract: warnings.warn shows UserWarning and __main__'s DeprecationWarning once, with the default filters."""
import os
import sys
import warnings

RANK = int(os.environ["RANK"])
sys.stdout.write(f"FACT rank={RANK} warnoptions={sys.warnoptions}\n")
sys.stdout.write(f"FACT rank={RANK} filters={[(f[0], f[2].__name__) for f in warnings.filters]}\n")
sys.stdout.flush()
for _ in range(2):
    warnings.warn(f"careful rank={RANK}")
warnings.warn(f"old api rank={RANK}", DeprecationWarning)
