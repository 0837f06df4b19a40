"""Ends as argv[1] says (a comma list: rank R takes item R), after an atexit handler and a line of output."""
import atexit
import os
import signal
import sys

how = sys.argv[1].split(",")[int(os.environ["RANK"])]
atexit.register(lambda: print("FACT atexit", flush=True))
if how == "hook":
    sys.excepthook = lambda t, v, tb: print(f"FACT hook {t.__name__}: {v}", file=sys.stderr, flush=True)
print(f"FACT before {how}", flush=True)


def boom():
    raise ValueError("FACT boom")


if how in ("exc", "hook"):
    boom()
elif how == "exit0":
    raise SystemExit
elif how == "exit3":
    sys.exit(3)
elif how == "exitstr":
    sys.exit("FACT bye")
elif how == "osexit0":
    sys.stdout.flush()
    os._exit(0)
elif how == "osexit5":
    os._exit(5)
elif how == "kbint":
    raise KeyboardInterrupt
elif how == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
print("FACT after", flush=True)
