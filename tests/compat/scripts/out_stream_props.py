"""Contract: sys.stdout/sys.stderr are configured as in a torchrun worker (buffering, encoding, tty)."""
import os
import sys

RANK = int(os.environ["RANK"])
for name in ("stdout", "stderr"):
    s = getattr(sys, name)
    for attr in ("line_buffering", "write_through", "encoding", "errors"):
        sys.stdout.write(f"FACT rank={RANK} {name}.{attr}={getattr(s, attr)}\n")
    sys.stdout.write(f"FACT rank={RANK} {name}.isatty={s.isatty()}\n")
    sys.stdout.write(f"FACT rank={RANK} {name}.fileno={s.fileno()}\n")
sys.stdout.write(f"FACT rank={RANK} PYTHONUNBUFFERED={os.environ.get('PYTHONUNBUFFERED')}\n")
