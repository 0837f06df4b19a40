"""One worker's view of the interpreter it runs in, as FACT lines (compared across launchers).
Rank 0 ends by sys.exit(), rank 1 by falling off the end; both run an atexit handler and a
non-daemon thread that outlives the main module."""
import atexit
import faulthandler
import logging
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time
import warnings

rank = int(os.environ["RANK"])


def square(x):
    return x * x


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.info("FACT log rank %d", rank)
    warnings.warn(f"FACT warn rank {rank}", stacklevel=1)
    same = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_SIGNALS_TO_HANDLE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "OMP_NUM_THREADS")
    present = ("MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")
    print(f"FACT env {[(k, os.environ.get(k)) for k in same]} {[k in os.environ for k in present]}", flush=True)
    main = sys.modules["__main__"]
    print(f"FACT main file={os.path.basename(main.__file__)} spec={main.__spec__} argv={sys.argv} "
          f"path0={sys.path[0] == os.path.dirname(os.path.abspath(__file__))}", flush=True)
    print(f"FACT hooks excepthook={sys.excepthook is sys.__excepthook__} faulthandler={faulthandler.is_enabled()} "
          f"factory={logging.getLogRecordFactory().__name__} root_handlers={len(logging.getLogger().handlers)}",
          flush=True)
    print(f"FACT signals sigint={signal.getsignal(signal.SIGINT).__name__} "
          f"sighup={signal.getsignal(signal.SIGHUP)} blocked={sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))}",
          flush=True)
    print(f"FACT stdin devnull={os.path.samestat(os.fstat(sys.stdin.fileno()), os.stat(os.devnull))} "
          f"line={sys.stdin.readline().strip()!r}", flush=True)
    import numpy as np
    import torch
    print(f"RNG rank {rank} {random.random()} {np.random.rand()} {torch.rand(1).item()}", flush=True)
    with mp.get_context("spawn").Pool(1) as pool:
        print(f"FACT spawn pool {pool.map(square, [1, 2, 3])}", flush=True)
    atexit.register(lambda: print(f"FACT atexit rank {rank}", flush=True))

    def late() -> None:
        time.sleep(0.3)
        print(f"FACT thread rank {rank}", flush=True)

    threading.Thread(target=late).start()
    if rank == 0:
        sys.exit()
