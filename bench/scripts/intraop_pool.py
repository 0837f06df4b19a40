"""Does a worker's intra-op thread pool work (issue 43: a forked worker ran 11 OS threads where torchrun's and an
exec'd one ran 24-26 on a 16-core H100 host)? Rank 0 prints one `POOL <json>` line: the OS threads before and after
a CPU matmul, torch's thread count, and the matmul's best time with the pool against one thread (their ratio is ~1
when the pool does not run: the work stays on the calling thread).

    torchrun --nproc-per-node 1 bench/scripts/intraop_pool.py
    resctl run --nproc-per-node 1 bench/scripts/intraop_pool.py
"""

import json
import os
import time

import torch
from hwcount import thread_names  # bench/scripts/hwcount.py, beside this script


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _best(x: torch.Tensor, rounds: int = 8) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        x @ x
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    x = torch.randn(1500, 1500)
    before = _threads()
    pool = _best(x)
    after = _threads()
    names = thread_names()
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    one = _best(x)
    torch.set_num_threads(n)
    if torch.cuda.is_available():  # the GPU host: which threads a CUDA context and its first kernels add
        (torch.ones(8, device="cuda") * 2).sum().item()
        names_cuda = thread_names()
    else:
        names_cuda = None
    if os.environ.get("RANK", "0") == "0":
        print("POOL " + json.dumps({"threads_before": before, "threads_after": after, "num_threads": n,
                                    "pool_ms": round(pool * 1e3, 2), "one_ms": round(one * 1e3, 2),
                                    "speedup": round(one / pool, 2), "thread_names": names,
                                    "thread_names_cuda": names_cuda,
                                    "omp_env": os.environ.get("OMP_NUM_THREADS")}), flush=True)


if __name__ == "__main__":
    main()
