"""Load's agreement on real gloo process groups, one per thread (what fits: a gloo group is a full
mesh, N(N-1) sockets in this one process). The engine's collectives before issue 25 (broadcast of
the candidates, all-gather of the memory steps, all-gather of the 257-int64 address rows, one
verdict all-reduce) against after (broadcast, all-reduce of the presence flags, the store lookup of
`agree.buddy_addr`, the verdict all-reduce)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from bench.scale.host import StoreHost


def run(n: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from resctl.checkpoint import agree

    threading.stack_size(1 << 20)
    with StoreHost(libuv=True) as host:
        stores = [dist.TCPStore("127.0.0.1", host.port, None, False, timeout=timedelta(seconds=300)) for _ in range(n)]
        groups: list[Any] = [None] * n
        times: dict[str, list[float]] = {"create": [0.0] * n, "before": [0.0] * n, "after": [0.0] * n}
        bar = threading.Barrier(n)

        def rank(r: int) -> None:
            t0 = time.monotonic()
            opts = dist.ProcessGroupGloo._Options()
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            opts._timeout = timedelta(seconds=300)
            pg = dist.ProcessGroupGloo(dist.PrefixStore("pg", stores[r]), r, n, opts)
            groups[r] = pg
            times["create"][r] = time.monotonic() - t0

            def bcast(values: list[int]) -> list[int]:
                t = torch.tensor(values, dtype=torch.int64)
                pg.broadcast([t], dist.BroadcastOptions()).wait()
                return t.tolist()

            def all_min(values: list[int]) -> list[int]:
                t = torch.tensor(values, dtype=torch.int64)
                o = dist.AllreduceOptions()
                o.reduceOp = dist.ReduceOp.MIN
                pg.allreduce([t], o).wait()
                return t.tolist()

            def gather(row: Any) -> None:
                out = [[torch.empty_like(row) for _ in range(n)]]
                pg.allgather(out, [row]).wait()

            bar.wait()
            t0 = time.monotonic()
            bcast([130, 120, 110])
            gather(torch.full((4,), 120, dtype=torch.int64))
            gather(torch.zeros(257, dtype=torch.int64))
            all_min([0])
            bar.wait()
            times["before"][r] = time.monotonic() - t0
            t0 = time.monotonic()
            bcast([130, 120, 110])
            agree.common_steps([120, 110], 4, bcast, all_min)
            agree.buddy_addr(dist.PrefixStore("addr", stores[r]), r, n, f"h{r}:1")
            all_min([0])
            bar.wait()
            times["after"][r] = time.monotonic() - t0

        threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sample = host.sample()
    return {"n": n, "create_s": max(times["create"]), "before_s": max(times["before"]),
            "after_s": max(times["after"]), "store": sample.__dict__}
