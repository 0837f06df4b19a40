"""resctl's own coordination at N ranks, real code over a real TCPStore in its own process:

- the stop step (`resctl.shim.stopstep`, and the version before issue 25 in `legacy_stopstep`):
  rank 0 is signalled, every other rank is woken by its wake thread, every rank's training thread
  agrees. Timed from rank 0's proposal to the last rank holding the agreed step.
- load's agreement before a restore (`resctl.checkpoint.engine` + `agree`): rank 0's candidate
  list broadcast, the steps every rank holds, the buddy node's replica address, one verdict
  all-reduce(MIN). The engine runs these as torch.distributed collectives; here each collective
  is played over the store, the way a store-based collective costs (a broadcast: one set, N gets;
  an all-gather: N sets, N multi-gets of N keys; an all-reduce(MIN): one add per rank, a counter
  and a wait). "before": the two all-gathers the engine used; "after": `agree.common_steps` and
  `agree.buddy_addr` (the real functions). Round trips and bytes per rank are machine-independent.
"""

from __future__ import annotations

import random
import resource
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any, Callable

from bench.scale.counting import Counting, per_participant, total
from bench.scale.host import StoreHost

CLIENT_TIMEOUT = timedelta(seconds=300)


def _clients(port: int, n: int, prefix: str) -> list[Any]:
    import torch.distributed as dist

    return [dist.PrefixStore(prefix, dist.TCPStore("127.0.0.1", port, None, False, timeout=CLIENT_TIMEOUT))
            for _ in range(n)]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _threads(n: int, body: Callable[[int], None]) -> None:
    threading.stack_size(512 * 1024)
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            body(r)
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} rank(s) failed: {errors[0]!r}")


# --- the stop step ----------------------------------------------------------------------------


def stop_step(n: int, impl: str = "after", repeats: int = 1) -> dict[str, Any]:
    """`repeats` stops over one store host (fresh keys and `StopStep`s each time); the wall time
    reported is the median, its spread in `walls`, the rest is of the last stop."""
    with StoreHost(libuv=True) as host:
        bases = [b for b in _clients(host.port, n, "stop")]
        walls = []
        for i in range(repeats):
            row = _one_stop(host, bases, i, n, impl)
            walls.append(row["wall_s"])
        row["walls"] = walls
        row["wall_s"] = sorted(walls)[len(walls) // 2]
    return row


def _one_stop(host: StoreHost, bases: list[Any], i: int, n: int, impl: str) -> dict[str, Any]:
    import torch.distributed as dist

    if impl == "after":
        from resctl.shim.stopstep import StopStep
    else:
        from bench.scale.legacy_stopstep import StopStep  # type: ignore[no-redef]
    rng = random.Random(n + i)
    steps = [100 + rng.randint(0, 2) for _ in range(n)]  # ranks a step or two apart
    counters = [Counter() for _ in range(n)]
    ranks = [StopStep(Counting(dist.PrefixStore(str(i), b), counters[r]), r, n) for r, b in enumerate(bases)]
    woken = [threading.Event() for _ in range(n)]
    for r, s in enumerate(ranks):
        if r:
            s.watch(woken[r].set)
    for c in counters:
        c.clear()  # count the stop, not the set-up
    time.sleep(0.5)  # the wake threads are in their waits
    host.mark()
    done = [0.0] * n
    agreed = [0] * n
    t0 = time.monotonic()
    cpu0 = _cpu()

    def rank(r: int) -> None:
        if r:
            woken[r].wait(120)
        s = ranks[r]
        if s.claim():
            threading.Thread(target=s.propose, args=(steps[r],), daemon=True).start()
        agreed[r] = s.agree(timeout=120)
        done[r] = time.monotonic()

    _threads(n, rank)
    cpu = _cpu() - cpu0
    sample = host.sample()
    for s in ranks:
        s.close(join_timeout=1)
    assert set(agreed) == {max(steps)}, "the ranks disagree"
    ops = total(counters)
    return {"n": n, "impl": impl, "wall_s": max(done) - t0, "p50_s": sorted(done)[n // 2] - t0,
            "client_cpu_s": cpu, "per_rank": per_participant(ops, n), "store": sample.__dict__}


# --- load's agreement -------------------------------------------------------------------------


class StoreCollectives:
    """One rank's collectives over the store (see the module docstring); `tag` keeps calls apart."""

    def __init__(self, store: Any, rank: int, n: int) -> None:
        self.s, self.rank, self.n, self.calls = store, rank, n, 0

    def _tag(self) -> str:
        self.calls += 1
        return f"c{self.calls}/"

    def broadcast(self, values: list[int]) -> list[int]:
        tag = self._tag()
        if self.rank == 0:
            self.s.set(tag + "v", ",".join(map(str, values)))
        return [int(v) for v in self.s.get(tag + "v").decode().split(",") if v]

    def all_min(self, values: list[int]) -> list[int]:
        # 0/1 flags: MIN is 0 where any rank gave 0. One add per rank carries all of them, each
        # element's count of zeros a digit in base n+1 (the one aggregated key), then a counter
        # and a wait.
        tag = self._tag()
        base = self.n + 1
        self.s.add(tag + "zeros", sum(base**i for i, v in enumerate(values) if not v))
        if self.s.add(tag + "count", 1) == self.n:
            self.s.set(tag + "all", "1")
        self.s.wait([tag + "all"])
        zeros = int(self.s.get(tag + "zeros"))
        return [0 if (zeros // base**i) % base else 1 for i in range(len(values))]

    def all_gather(self, value: bytes) -> list[bytes]:
        tag = self._tag()
        self.s.set(f"{tag}{self.rank}", value)
        return self.s.multi_get([f"{tag}{r}" for r in range(self.n)])


def _common_before(coll: StoreCollectives, local: list[int], width: int) -> list[int]:
    every = coll.all_gather(",".join(map(str, local[:width])).encode().ljust(8 * width))
    common = set(local)
    for row in every:
        common &= {int(v) for v in row.decode().split(",") if v.strip()}
    return sorted(common, reverse=True)


def _buddy_before(coll: StoreCollectives, node: int, own: str) -> str | None:
    from resctl.checkpoint import replica

    rows = coll.all_gather(f"{node}|{own}".encode().ljust(8 * 257))  # the engine's 257 int64 row
    addrs: dict[int, str] = {}
    for row in rows:
        k, _, a = row.decode().strip().partition("|")
        addrs.setdefault(int(k), a)
    target = replica.buddy(node, list(addrs))
    return addrs.get(target) if target is not None else None


def ckpt_agree(n: int, impl: str = "after", width: int = 4) -> dict[str, Any]:
    from resctl.checkpoint import agree

    local = [120, 110]  # every rank holds memory snapshots 120 and 110 (two slots)
    with StoreHost(libuv=True) as host:
        counters = [Counter() for _ in range(n)]
        bases = _clients(host.port, n, "load")
        stores = [Counting(b, counters[r]) for r, b in enumerate(bases)]
        done = [0.0] * n
        result: list[Any] = [None] * n
        start = threading.Barrier(n)
        t0 = [0.0]
        host.mark()
        cpu0 = _cpu()

        def rank(r: int) -> None:
            coll = StoreCollectives(stores[r], r, n)
            own = f"10.0.{r // 256}.{r % 256}:29600"
            if start.wait() == 0:
                t0[0] = time.monotonic()
            coll.broadcast([130, 120, 110])  # _broadcast_steps: rank 0's disk candidates
            if impl == "after":
                addr = agree.buddy_addr(stores[r], r, n, own)
                steps = agree.common_steps(local, width, coll.broadcast, coll.all_min)
            else:
                addr = _buddy_before(coll, r, own)
                steps = _common_before(coll, local, width)
            verdict = coll.all_min([1])  # _min_over_ranks of the verdict on the newest step
            result[r] = (addr, steps, verdict)
            done[r] = time.monotonic()

        _threads(n, rank)
        cpu = _cpu() - cpu0
        sample = host.sample()
    want_addr = [f"10.0.{((r + 1) % n) // 256}.{((r + 1) % n) % 256}:29600" for r in range(n)]
    assert [x[0] for x in result] == want_addr and all(x[1] == [120, 110] for x in result), result[:2]
    ops = total(counters)
    return {"n": n, "impl": impl, "wall_s": max(done) - t0[0], "client_cpu_s": cpu,
            "per_rank": per_participant(ops, n), "store": sample.__dict__}
