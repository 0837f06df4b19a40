"""What the stop step (resctl/shim/stopstep.py) costs: per step boundary on the happy path, and the
agreement itself when a job is stopped, measured side by side in one process.

Happy path: `Checkpointer.maybe_save` at a step boundary that saves nothing (interval not due), in
alternating blocks: a checkpointer as the engine uses it alone (no gate), then one wired as the shim
wires it (`hooks`, a `StopStep` over a real TCPStore whose watch thread is blocked
in the store's wait, as it is for the whole job). Reports the median call time of each block kind.

Agreement: two `StopStep`s (ranks 0 and 1, threads) over one TCPStore on loopback; rank 1 proposes,
rank 0 is woken by its watch thread and proposes, rank 0's training thread agrees. Reports the
median time from rank 1's proposal to rank 0's agreed step.

    python bench/bench_stop_step.py --blocks 20 --calls 20000 --agreements 50
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path


def boundary_ns(ckpt: object, calls: int) -> float:
    state = {"x": 0}
    t0 = time.perf_counter_ns()
    for step in range(1, calls + 1):
        ckpt.maybe_save(state, step)  # type: ignore[attr-defined]
    return (time.perf_counter_ns() - t0) / calls


def happy_path(blocks: int, calls: int) -> tuple[float, float]:
    import torch.distributed as dist

    from resctl.checkpoint import Checkpointer
    from resctl.checkpoint.hooks import NoHooks
    from resctl.shim.stopstep import StopStep

    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    tmp = Path(tempfile.mkdtemp())
    plain = Checkpointer(dir=tmp / "a", interval_steps=10**9, async_=False)
    wired = Checkpointer(dir=tmp / "b", interval_steps=10**9, async_=False, hooks=NoHooks())
    stop = StopStep(dist.PrefixStore("job", server), 0, 2)
    stop.watch(lambda: None)
    a: list[float] = []
    b: list[float] = []
    for _ in range(blocks):
        a.append(boundary_ns(plain, calls))
        b.append(boundary_ns(wired, calls))
    return statistics.median(a), statistics.median(b)


def agreement(n: int) -> float:
    import torch.distributed as dist

    from resctl.shim.stopstep import StopStep

    server = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    times = []
    for i in range(n):
        store = dist.PrefixStore(f"run{i}", server)
        r0, r1 = StopStep(store, 0, 2), StopStep(store, 1, 2)
        r0.watch(lambda: r0.claim() and r0.propose(11))
        done = threading.Event()
        out: list[float] = []

        def train(t_start: list[float]) -> None:
            r0.agree(timeout=10)
            out.append(time.perf_counter() - t_start[0])
            done.set()

        t_start = [0.0]
        time.sleep(0.01)  # the watch thread is waiting
        t_start[0] = time.perf_counter()
        r1.claim()
        r1.propose(10)
        threading.Thread(target=train, args=(t_start,)).start()
        done.wait(10)
        times.append(out[0])
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--agreements", type=int, default=50)
    args = ap.parse_args()
    plain, wired = happy_path(args.blocks, args.calls)
    print(f"maybe_save at a boundary that saves nothing, median of {args.blocks} blocks x {args.calls} calls:")
    print(f"  engine alone: {plain:.0f} ns   wired as the shim wires it (stop step open): {wired:.0f} ns   "
          f"difference: {wired - plain:+.0f} ns")
    print(f"agreement of 2 ranks over a loopback TCPStore, median of {args.agreements}: "
          f"{agreement(args.agreements) * 1e3:.2f} ms from the first proposal to the agreed step")


if __name__ == "__main__":
    main()
