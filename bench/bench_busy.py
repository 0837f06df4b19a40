"""The per-call cost of resctl.shim.busy (issue 41), in one process: a step boundary untimed and timed, one timed
`Work.wait` (less the wait itself), DDP's last-bucket note and callback. Best of 7 x `--calls` each.

    python bench/bench_busy.py                                  # this checkout
    python bench/bench_busy.py --path /tmp/before               # another checkout's busy.py (the columns it has)
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
import weakref
from pathlib import Path
from typing import Any, Callable


def per_call(f: Callable[[], Any], calls: int) -> float:
    return min(timeit.repeat(f, number=calls, repeat=7)) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--path", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--calls", type=int, default=200_000)
    a = ap.parse_args()
    sys.path.insert(0, str(a.path))
    from resctl.shim import busy

    now = time.monotonic
    plain = busy.BusyClock()
    print(f"{busy.__file__}")
    print(f"boundary, untimed, no DDP module: {per_call(lambda: plain.boundary(now()), a.calls):.3f} us")
    class Module:
        pass

    module = Module()
    waiting = busy.BusyClock()
    waiting.waiting = [weakref.ref(module)]
    print(f"boundary, untimed, a DDP module waiting: {per_call(lambda: waiting.boundary(now()), a.calls):.3f} us")
    if not hasattr(busy, "waited"):
        return
    timed = busy.BusyClock()
    timed.timing = timed.reporting = True
    print(f"boundary, timed (CPU): {per_call(lambda: timed.boundary(now()), a.calls):.3f} us")
    def wait(work: Any) -> None:
        return None

    print(f"one timed Work.wait, less the wait: {per_call(lambda: busy.waited(timed, wait, None), a.calls):.3f} us")

    class Fut:
        def value(self) -> int:
            return 1

    fut, grads = Fut(), object()

    def last_bucket() -> None:
        timed.bucket_issued(grads)
        timed.bucket_done(fut)

    print(f"DDP last bucket issued + done: {per_call(last_bucket, a.calls):.3f} us")


if __name__ == "__main__":
    main()
