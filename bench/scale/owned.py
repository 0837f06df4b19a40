"""resctl's rendezvous (`resctl.launch.owned_rdzv`, issue 25), real code: one handler per simulated
node, each in a thread with its own TCPStore client (and the keep-alive's clone), against one store
host in its own process (the pre-libuv server, as NVRx's `_create_tcp_store` makes it).

The scenario of `bench.scale.rdzv` (NVRx's), so the rows compare: every node joins round 0; one node
is lost; the survivors and a replacement run the restart round each agent runs (`next_rendezvous`,
the rank assignment, which here reads each node's local world size from the round's outcome instead
of an all-gather, and the MASTER_ADDR/PORT keys). Variants:

- `replace`: nnodes N:N, the lost node's keep-alive just stops and a replacement comes (the Job
  recreates the pod): the round closes when N nodes came, whatever the lost node's heartbeat says;
- `known`: nnodes 1:N, no replacement, the loss is known (the node's `resctl run` saw its launcher
  die and marked it dead): the round closes as soon as the N-1 survivors came;
- `silent`: nnodes 1:N, no replacement, nobody saw it: the round closes once the lost node's
  heartbeat is keep_alive x misses old (1 s x 3 here).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any, Callable

from bench.scale.counting import Counting, per_participant, total
from bench.scale.host import StoreHost
from bench.scale.rdzv import run_rounds


class Node:
    """One simulated node's agent on resctl's rendezvous."""

    def __init__(self, port: int, run_id: str, min_nodes: int, max_nodes: int, keep_alive: float, misses: int,
                 guard: Callable[[Any], Any] | None = None) -> None:
        """`guard`: wraps the handler's store (as the launcher wraps it in a StoreGuard: bench/scale/storeloss.py)."""
        import torch.distributed as dist

        from resctl.launch.owned_rdzv import OwnedRendezvousHandler, _Settings

        self.client = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=600), use_libuv=False)
        self.ops: Counter = Counter()
        settings = _Settings(run_id, min_nodes, max_nodes, 900.0, 30.0, keep_alive, misses, True)
        # The keep-alive's own connection, made here: N threads connecting at once in one process
        # stalled every thread for 5 s (measured; one process per node in a real job).
        beat = Counting(dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=600),
                                      use_libuv=False), self.ops)
        self.ops["connections"] += 1

        def connect() -> Counting:
            return beat

        store = Counting(self.client, self.ops)
        self.handler = OwnedRendezvousHandler(guard(store) if guard else store, settings, base_store=self.client,
                                              connect=connect)
        self.handler.local_world_size = 8
        self.done = self.rdzv_done = 0.0
        self.rank = -1
        self.error: BaseException | None = None

    def round(self) -> None:
        """`next_rendezvous`, the rank assignment from the outcome, the master keys (as the agent does)."""
        try:
            store, rank, world = self.handler.next_rendezvous()
            self.rank = rank
            self.rdzv_done = time.monotonic()
            outcome = self.handler._outcome
            assert outcome is not None and outcome.size == world
            sum(outcome.local_world_sizes)  # the role infos, built locally (owned_rdzv.gathered)
            counted = Counting(store, self.ops)
            if rank == 0:
                counted.set("MASTER_ADDR", b"127.0.0.1")
                counted.set("MASTER_PORT", b"29501")
            counted.get("MASTER_ADDR")
            counted.get("MASTER_PORT")
        except BaseException as err:  # noqa: BLE001 - reported by the harness
            self.error = err
        self.done = time.monotonic()

    def lose(self) -> None:
        self.handler._stop_heartbeats()


def scenario(n: int, variant: str = "replace", keep_alive: float = 1.0, misses: int = 3) -> dict[str, Any]:
    """Round 0 with `n` nodes, one node lost, the restart round (see the module's variants); measures."""
    logging.getLogger("resctl").setLevel(logging.WARNING)
    threading.stack_size(512 * 1024)
    run_id = f"owned{n}{variant}"
    min_nodes = n if variant == "replace" else 1
    everyone: list[Node] = []
    with StoreHost(libuv=False) as host:
        try:
            return _scenario(host, everyone, n, variant, run_id, min_nodes, keep_alive, misses)
        finally:
            for x in everyone:
                x.lose()


def _scenario(host: StoreHost, everyone: list[Node], n: int, variant: str, run_id: str, min_nodes: int,
              keep_alive: float, misses: int) -> dict[str, Any]:
    from resctl.launch.owned_rdzv import mark_dead

    nodes = [Node(host.port, run_id, min_nodes, n, keep_alive, misses) for _ in range(n)]
    everyone.extend(nodes)
    start_wall, _, start_cpu = run_rounds(nodes)
    start_ops = total(x.ops for x in nodes)
    ranks_before = {id(x): x.rank for x in nodes}
    polls = []
    for x in nodes[:: max(1, n // 16)]:
        t0 = time.perf_counter()
        x.handler.num_nodes_waiting()
        polls.append(time.perf_counter() - t0)
    for x in nodes:
        x.ops.clear()
    lost = nodes[n // 2]
    lost.lose()
    host.mark()
    t_fault = time.monotonic()
    if variant == "known":
        mark_dead(lost.client, run_id, lost.handler._slot)
    survivors = [x for x in nodes if x is not lost]
    if variant == "replace":
        survivors.append(Node(host.port, run_id, min_nodes, n, keep_alive, misses))
        everyone.append(survivors[-1])
    wall, rdzv_wall, cpu = run_rounds(survivors)
    ops = total(x.ops for x in survivors)
    sample = host.sample()
    kept = sum(1 for x in survivors if ranks_before.get(id(x)) == x.rank)
    world = {x.rank for x in survivors}
    assert world == set(range(len(survivors))), "every rank once"
    reader = survivors[0]  # the typed state a peer's stop, a spare or the preflight's wait reads (issue 30)
    reader.ops.clear()
    t0 = time.perf_counter()
    state = reader.handler.state()
    state_s = time.perf_counter() - t0
    assert state.size == len(survivors), (state.size, len(survivors))
    return {
        "n": n, "variant": variant, "keep_alive_s": keep_alive, "misses": misses,
        "start_round_s": start_wall, "start_round_cpu_s": start_cpu, "start_round": per_participant(start_ops, n),
        "restart_round_s": wall, "restart_rdzv_s": rdzv_wall, "restart_round_cpu_s": cpu,
        "restart_round": per_participant(ops, len(survivors)),
        "survivors_kept_rank": kept, "survivors": len(survivors) - (variant == "replace"),
        "poll_s_p50": sorted(polls)[len(polls) // 2],
        "state_read_s": state_s, "state_read": per_participant(reader.ops, 1),
        "store": sample.__dict__, "t_fault": t_fault,
        "critical_s": sample.cpu_s + cpu / len(survivors) + per_participant(ops, len(survivors))["round_trips"] * 100e-6,
    }
