"""The launcher's rendezvous, real code: NVRx 0.4.1's `FtRendezvousHandler` (what ft_launcher
registers as "c10d") over `C10dRendezvousBackend`, one handler per simulated node, each in a thread
with its own TCPStore client, against one store host (NVRx's rendezvous store: the pre-libuv
server, `use_libuv` defaulting to false in `_create_tcp_store`).

One scenario per N: every node joins round 0 (the job's start); node `lost` disappears (its
handler stops its keep-alive and is never called again); the survivors and a replacement node
join the next round (what each agent's `_restart_workers` does after its workers failed:
`next_rendezvous`, then `_assign_worker_ranks`' store all-gather and the MASTER_ADDR/PORT keys).
A round cannot close before the lost node's keep-alive expires (`keep_alive_interval` x
`keep_alive_max_attempt`, 5 s x 3 in NVRx 0.4.1, hard-coded): the harness records when that
expiry allowed progress, so the algorithm's own cost is seen apart from that constant.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections import Counter
from datetime import timedelta
from typing import Any

from bench.scale.counting import Counting, per_participant, total
from bench.scale.host import StoreHost


class _NoIpc:
    """Stands in for the launcher's IPC socket to its ranks (one per process: N handlers in one
    process would share its path). The rendezvous only drains it for control requests."""

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def start_receiving(self) -> None:
        pass

    def fetch_received(self) -> list[Any]:
        return []


def _quiet() -> None:
    for name in ("nvidia_resiliency_ext", "torch.distributed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as ftr

    ftr.IpcConnector = _NoIpc  # type: ignore[misc]


class Node:
    """One simulated node's agent: a rendezvous handler and its store client."""

    def __init__(self, port: int, run_id: str, n: int, keep_alive: float, attempts: int, last_call: float) -> None:
        import torch.distributed as dist
        from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as ftr
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )

        self.client = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=600), use_libuv=False)
        self.ops: Counter = Counter()
        backend = C10dRendezvousBackend(Counting(self.client, self.ops), run_id)
        timeout = ftr.RendezvousTimeout(join=timedelta(seconds=900), last_call=timedelta(seconds=last_call))
        settings = ftr.RendezvousSettings(run_id, n, n, timeout, keep_alive_interval=timedelta(seconds=keep_alive),
                                          keep_alive_max_attempt=attempts, upscaling_enabled=True)
        node = ftr.FtRendezvousHandler._node_desc_generator.generate("127.0.0.1")
        self.handler = ftr.FtRendezvousHandler(node, settings, "c10d", self.client,
                                               ftr._BackendRendezvousStateHolder(backend, settings))
        self.done = 0.0
        self.rank = -1
        self.error: BaseException | None = None

    def round(self, share: bool) -> None:
        """`next_rendezvous`, then (share) the agent's rank assignment all-gather and master keys."""
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.utils import store as store_util

        try:
            store, rank, world = self.handler.next_rendezvous()
            self.rank = rank
            self.rdzv_done = time.monotonic()
            if share:
                import torch.distributed as dist

                counted = Counting(dist.PrefixStore(f"torch.rendezvous.x.{self.handler._state_holder.state.round}",
                                                    self.client), self.ops)
                store_util.synchronize(counted, f"role{rank}".encode(), rank, world, "torchelastic/role_info")
                if rank == 0:
                    counted.set("MASTER_ADDR", b"127.0.0.1")
                    counted.set("MASTER_PORT", b"29501")
                counted.get("MASTER_ADDR")
                counted.get("MASTER_PORT")
        except BaseException as err:  # noqa: BLE001 - reported by the harness
            self.error = err
        self.done = time.monotonic()

    def state_bytes(self) -> int:
        got = self.client.get("torch.rendezvous." + self.handler._settings.run_id)
        return len(got)

    def poll(self) -> float:
        """One monitor-loop poll of the agent (`num_nodes_waiting`: a full state read), timed."""
        holder = self.handler._state_holder
        holder._last_sync_time = -1e9  # bypass the cache, as a poll one monitor interval later does
        t0 = time.perf_counter()
        self.handler.num_nodes_waiting()
        return time.perf_counter() - t0

    def lose(self) -> None:
        self.handler._stop_heartbeats()


def run_rounds(nodes: list[Any], *round_args: Any) -> tuple[float, float, float]:
    """Every node's `round(*round_args)` in a thread of its own (nodes with `done`, `rdzv_done` and
    `error`; NVRx's here, resctl's in bench/scale/owned.py): (wall of the slowest node, wall to the
    last next_rendezvous, CPU of this process)."""
    threads = [threading.Thread(target=n.round, args=round_args, daemon=True) for n in nodes]
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    errors = [n.error for n in nodes if n.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} node(s) failed the rendezvous: {errors[0]!r}")
    cpu = cpu1.ru_utime - cpu0.ru_utime + cpu1.ru_stime - cpu0.ru_stime
    return max(n.done for n in nodes) - t0, max(n.rdzv_done for n in nodes) - t0, cpu


def scenario(n: int, keep_alive: float = 5.0, attempts: int = 3, last_call: float = 30.0) -> dict[str, Any]:
    """Round 0 with `n` nodes, one node lost, the restart round with a replacement; measures."""
    _quiet()
    threading.stack_size(512 * 1024)
    run_id = f"scale{n}"
    with StoreHost(libuv=False) as host:
        nodes = [Node(host.port, run_id, n, keep_alive, attempts, last_call) for _ in range(n)]
        start_wall, _, start_cpu = run_rounds(nodes, True)
        start_ops = total(n_.ops for n_ in nodes)
        state = nodes[0].state_bytes()
        polls = sorted(nodes[i].poll() for i in range(0, n, max(1, n // 16)))
        for node in nodes:
            node.ops.clear()
        lost = nodes[n // 2]
        t_fault = time.monotonic()
        lost.lose()
        replacement = Node(host.port, run_id, n, keep_alive, attempts, last_call)
        host.mark()
        survivors = [x for x in nodes if x is not lost] + [replacement]
        wall, rdzv_wall, cpu = run_rounds(survivors, True)
        ops = total(x.ops for x in survivors)
        host_sample = host.sample()
        expiry = keep_alive * attempts
        for x in survivors:
            x.lose()
    return {
        "n": n,
        "start_round_s": start_wall, "start_round_cpu_s": start_cpu,
        "start_round": per_participant(start_ops, n),
        "restart_round_s": wall, "restart_rdzv_s": rdzv_wall, "restart_round_cpu_s": cpu,
        "restart_round": per_participant(ops, n),
        "keep_alive_expiry_s": expiry,
        # The part of the restart round that is not the lost node's keep-alive expiry (which bounds
        # the round from below: its participant entry goes only once its heartbeat is that old).
        "restart_after_expiry_s": max(0.0, wall - expiry),
        "state_bytes": state, "poll_s_p50": polls[len(polls) // 2], "poll_s_max": polls[-1],
        "store": host_sample.__dict__,
        "t_fault": t_fault,
    }


def state_cost(n: int, reps: int = 5) -> dict[str, Any]:
    """The rendezvous state of a complete round of `n` nodes (participants, heartbeats, worker
    states), as NVRx writes it: its size, and one read-modify-write's CPU (b64decode + unpickle,
    pickle + b64encode), the work every compare-and-set attempt costs its node. The restart round
    needs about 2n successful attempts one after another (each node leaves, then joins), so
    2n x (this + one round trip) bounds it from below on any machine."""
    import base64
    import pickle
    from datetime import datetime

    from nvidia_resiliency_ext.fault_tolerance import _ft_rendezvous as ftr
    from torch.distributed.elastic.agent.server.api import WorkerState

    state = ftr._RendezvousState()
    gen = ftr._NodeDescGenerator()
    for i in range(n):
        node = gen.generate(f"node-{i:05d}.cluster.local")
        state.participants[node] = i
        state.last_heartbeats[node] = datetime.utcnow()
        state.worker_states[node] = WorkerState.HEALTHY
    state.complete = True
    blob = base64.b64encode(pickle.dumps(state))
    times = []
    for _ in range(reps):
        t0 = time.process_time()
        s = pickle.loads(base64.b64decode(blob))
        base64.b64encode(pickle.dumps(s))
        times.append(time.process_time() - t0)
    return {"n": n, "state_bytes": len(blob), "rmw_cpu_s": sorted(times)[reps // 2]}
