"""The rendezvous store lost and replaced (issue 42, `launch.store = "external"`), real code at N
simulated nodes: the store is `resctl store`'s server (`resctl.launch.store_server.serve`, in its own
process: bench/scale/host.py `--resctl PORT`), every node resctl's rendezvous handler (bench/scale/owned.py's
Node) over a `StoreGuard`, as `rdzv_install.owned_handler` wraps it for an external store.

- `lost`: N nodes in a formed round (nnodes N:N); each node's launcher monitor asks `num_nodes_waiting()`
  every `interval` (the launcher's poll; the polls of different nodes out of phase) while its keep-alive
  beats. After a healthy window the store process is SIGKILLed; each node's next poll fails, and the
  guard hands the loss to the node's `lost` (where the launcher's `StoreLost` records fatal.json and
  stops the job): the time from the kill to the last node's detection, raw and net of the wait for
  the next poll (detection minus the start of the poll that failed, or the kill if that came later).
- `replaced`: a new store on the same port (`resctl store` restarted), N new nodes (the job restarted:
  new launchers, new connections) rendezvous from scratch (round 0): from the store being ready to the
  round complete at every node.
"""

from __future__ import annotations

import logging
import random
import resource
import socket
import statistics
import threading
import time
from typing import Any, NoReturn

from bench.scale.counting import per_participant, total
from bench.scale.host import StoreHost
from bench.scale.owned import Node
from bench.scale.rdzv import run_rounds

#: Round-trip time of the critical-path estimate (as bench/scale/__main__.py's RTT_S).
RTT_S = 100e-6


class _Stopped(Exception):
    """Where the launcher's StoreLost stops the job (SIGTERM to itself): this node's monitor ends."""


class Watch:
    """One node's launcher monitor: the rendezvous poll every `interval` (NVRx's `_invoke_run`: sleep,
    then `num_nodes_waiting()`), through the store guard."""

    def __init__(self, interval: float, seed: int) -> None:
        self.interval, self.seed = interval, seed
        self.node: Node | None = None
        self.polls = 0
        self.poll_at = self.detected = 0.0
        self.message = ""
        self.error: BaseException | None = None

    def guard(self, store: Any) -> Any:
        from resctl.launch.store_guard import StoreGuard

        return StoreGuard(store, self.lost)

    def lost(self, err: BaseException) -> NoReturn:
        from resctl.launch.store_guard import StoreLost, endpoint_of

        self.detected = time.monotonic()
        assert self.node is not None
        self.message = StoreLost(endpoint_of(self.node.client), True).message(err)
        raise _Stopped(self.message) from err

    def run(self, stop: threading.Event) -> None:
        assert self.node is not None
        stop.wait(random.Random(self.seed).uniform(0, self.interval))  # launchers started apart
        while not stop.wait(self.interval):
            self.poll_at = time.monotonic()
            try:
                self.node.handler.num_nodes_waiting()
            except _Stopped:
                return
            except BaseException as err:  # noqa: BLE001 - anything but the guard's stop is a failure here
                self.error = err
                return
            self.polls += 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _quiet() -> None:
    logging.getLogger("resctl").setLevel(logging.CRITICAL)  # the keep-alive's failed beats after the loss
    threading.stack_size(512 * 1024)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def lost(n: int, port: int, interval: float = 0.5, window: float = 3.0, keep_alive: float = 1.0,
         misses: int = 3) -> dict[str, Any]:
    """A formed round of `n` nodes polling through the guard, `window` s healthy, the store SIGKILLed."""
    _quiet()
    watches = [Watch(interval, i) for i in range(n)]
    nodes: list[Node] = []
    with StoreHost(resctl_port=port) as host:
        try:
            for w in watches:
                nodes.append(Node(port, f"store{n}", n, n, keep_alive, misses, guard=w.guard))
                w.node = nodes[-1]
            return _lost(host, nodes, watches, window)
        finally:
            for x in nodes:
                x.lose()


def _lost(host: StoreHost, nodes: list[Node], watches: list[Watch], window: float) -> dict[str, Any]:
    n, interval = len(nodes), watches[0].interval
    start_wall, _, _ = run_rounds(nodes)
    stop = threading.Event()
    threads = [threading.Thread(target=w.run, args=(stop,), daemon=True) for w in watches]
    for t in threads:
        t.start()
    stop.wait(2 * interval)  # every monitor polling
    peer_watches = [x.handler._watch for x in nodes]  # each node's look at the next one's keep-alive
    assert all(w is not None for w in peer_watches), "a formed round of 2 or more: every node watches one"
    for x in nodes:  # the load without the peer watch first (issue 42's machine loss; what it adds)
        x.handler._watch = None
    unwatched, elapsed0, _, _, sample0 = _healthy(host, nodes, watches, window)
    for x, w in zip(nodes, peer_watches):
        x.handler._watch = w
    healthy, elapsed, polls, cpu, sample = _healthy(host, nodes, watches, window)
    assert not any(x.handler._peer_lost for x in nodes), "a live node taken for lost"
    cpu0, t_kill = _cpu(), time.monotonic()
    host.kill()
    for t in threads:
        t.join(timeout=interval + 120)
    stop.set()
    detect_cpu = _cpu() - cpu0
    failed = [w.error for w in watches if w.error is not None]
    missed = sum(1 for w in watches if not w.detected)
    if failed or missed:
        raise RuntimeError(f"{missed} node(s) never saw the loss, {len(failed)} failed: {failed[:1]!r}")
    assert all(f"127.0.0.1:{host.port}" in w.message and "unreachable" in w.message for w in watches)
    raw = [w.detected - t_kill for w in watches]
    net = [w.detected - max(w.poll_at, t_kill) for w in watches]
    per_interval = interval / elapsed
    load = per_participant(healthy, n)
    return {
        "n": n, "interval_s": interval, "window_s": round(elapsed, 3), "start_round_s": start_wall,
        "detect_raw_s": max(raw), "detect_raw_p50_s": statistics.median(raw),
        "detect_net_s": max(net), "detect_net_p50_s": statistics.median(net),
        "detect_cpu_s": detect_cpu, "healthy_cpu_s": cpu,
        "polls_per_interval": polls / n * per_interval,
        "per_interval": {k: v * per_interval for k, v in load.items()},
        "per_interval_no_watch": {k: v * interval / elapsed0 for k, v in per_participant(unwatched, n).items()},
        "store": sample.__dict__, "store_no_watch": sample0.__dict__,
        # On N machines each node detects on its own: its poll's one failed request (the wait excluded).
        "critical_s": detect_cpu / n + RTT_S,
    }


def _healthy(host: StoreHost, nodes: list[Node], watches: list[Watch], window: float) -> tuple[Any, float, int, float, Any]:
    """`window` s of the formed round: (the store requests, elapsed s, monitor polls, harness CPU, store sample)."""
    for x in nodes:
        x.ops.clear()
    host.mark()
    t0, cpu0, polls0 = time.monotonic(), _cpu(), sum(w.polls for w in watches)
    time.sleep(window)
    ops, elapsed = total(x.ops for x in nodes), time.monotonic() - t0
    return ops, elapsed, sum(w.polls for w in watches) - polls0, _cpu() - cpu0, host.sample()


def replaced(n: int, port: int, keep_alive: float = 1.0, misses: int = 3) -> dict[str, Any]:
    """A new store on `port`, `n` new nodes, round 0 from scratch: from the store ready to the round done."""
    _quiet()
    nodes: list[Node] = []
    t0 = time.monotonic()
    with StoreHost(resctl_port=port) as host:
        ready = time.monotonic()
        host.mark()
        try:
            connects = []
            for _ in range(n):
                t = time.monotonic()
                nodes.append(Node(port, f"store{n}", n, n, keep_alive, misses))
                connects.append(time.monotonic() - t)
            connected = time.monotonic()
            wall, rdzv_wall, cpu = run_rounds(nodes)
            done = time.monotonic()
            sample = host.sample()
        finally:
            for x in nodes:
                x.lose()
    assert {x.rank for x in nodes} == set(range(n)), "every rank once"
    ops = per_participant(total(x.ops for x in nodes), n)
    return {
        "n": n, "store_start_s": ready - t0, "connect_s": connected - ready, "round_s": wall,
        # One node's two connections (client, keep-alive); > 1 s: a TCPStore client's reverse DNS lookup
        # that this VM's resolver dropped (5 s: docs/BENCHMARKS.md).
        "connect_node_p50_s": statistics.median(connects), "connect_stalls": sum(c > 1 for c in connects),
        "rdzv_s": rdzv_wall, "ready_to_round_s": done - ready, "round_cpu_s": cpu, "round": ops,
        "store": sample.__dict__,
        # On N machines: one node's connections, the store's serial work since it was ready (every
        # connection included), one node's share of the round's client work, its round trips in sequence.
        "critical_s": statistics.median(connects) + sample.cpu_s + cpu / n + ops["round_trips"] * RTT_S,
    }
