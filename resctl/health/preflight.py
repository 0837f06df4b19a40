"""Cluster preflight: every node meets the others, runs real collectives and a matmul, and the nodes are judged.

One process per node (`resctl doctor --cluster`, or `resctl run` with `launch.preflight = "cluster"`,
before the launcher starts). The node on the rendezvous host keeps a TCPStore on the preflight port
(`health.preflight_port`, default the rendezvous port + 1), so the launcher's own rendezvous port is
never in use by the preflight. Then, in order:

1. join: each node registers (its rank: the scheduler's node rank, else the order it came in); the host
   waits for launch.nnodes' maximum, or the minimum and `JOIN_GRACE` more, or `health.preflight_timeout`;
   a node that has not come by then is named broken (by rank and, where the scheduler names nodes, host);
2. a process group over the nodes that joined (gloo on CPU, NCCL on GPU);
3. a matmul on every device of the node (GFLOP/s; the slowest device counts);
4. all together: the latency of a one-element all-reduce and the bandwidth of an all-reduce of
   `health.preflight_mb` MB;
5. in pairs: every pair of nodes once (round-robin rounds, disjoint pairs at the same time), a ping-pong
   of the same size (bandwidth) and of 4 bytes (latency);
6. the host judges (`judge`, pure): a node is slow when its matmul rate or the median bandwidth of its
   links is worse than the other nodes' median by `health.preflight_margin`, or a link is under
   `health.preflight_min_gbps`; broken when it did not join or a test failed on it. By
   `health.preflight_policy` the verdict is ok, fail, or exclude (the named nodes leave, the others go on
   when at least launch.nnodes' minimum is left). Every node reads the verdict and acts on it.

`python -m resctl.health.preflight CONFIG_JSON` runs one node and prints the verdict as JSON on its last
stdout line: `resctl run` runs it as a child, so no CUDA context of the preflight stays in the process
that lives as long as the job.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import statistics
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

JOIN_GRACE = 3.0  # seconds the host waits for more nodes once launch.nnodes' minimum has joined
PREFIX = "resctl-preflight/"


@dataclass(frozen=True)
class Config:
    host: str  # the store's host (the rendezvous host)
    port: int
    nnodes_min: int
    nnodes_max: int
    is_host: bool
    node_rank: int | None = None
    hostname: str = field(default_factory=socket.gethostname)
    node_name: str = ""  # its scheduler's name for the node (Slurm node, Kubernetes node); "": the host name
    policy: str = "fail"
    margin: float = 0.5
    min_gbps: float | None = None
    mb: int = 0
    timeout: float = 60.0
    backend: str = "auto"  # auto: nccl when CUDA is there, else gloo
    expected_hosts: tuple[str, ...] = ()  # rank -> host where the scheduler names them (names missing nodes)


@dataclass
class Verdict:
    action: str  # ok, fail, exclude; spare: this node came to a full job (it goes on and waits)
    nodes: list[dict[str, Any]]  # one row per node: rank, host, gflops, link_gbps, latency_ms, status, why
    excluded: list[int]
    members: list[int]  # ranks that joined
    all_gbps: float | None = None
    all_latency_ms: float | None = None
    seconds: float = 0.0
    backend: str = ""
    message: str = ""
    phases: dict[str, float] = field(default_factory=dict)  # seconds on this node: join, tests, verdict

    def node(self, rank: int) -> dict[str, Any] | None:
        return next((n for n in self.nodes if n["rank"] == rank), None)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- pure parts ---------------------------------------------------------------------------------

def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of 0..n-1 once, in n-1 (n even) or n (odd) rounds of disjoint pairs (the circle method)."""
    ids: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ids)
    out = []
    for _ in range(m - 1):
        pairs = [(ids[i], ids[m - 1 - i]) for i in range(m // 2)]
        out.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return out


def _slow(value: float | None, others: list[float], margin: float) -> float | None:
    """The others' median when `value` is worse than it by more than `margin` (higher is better)."""
    if value is None or not others:
        return None
    median = statistics.median(others)
    return median if value * (1 + margin) < median else None


def _slow_links(r: int, pair_gbps: dict[tuple[int, int], float], suspects: set[int],
                margin: float) -> tuple[float | None, float | None]:
    """(the median of node r's links, the median of the links between other nodes when r's are worse by more
    than `margin`, else None). Pairs with a suspect node (slow CPU, failed test) count for neither side, so one
    node's slow link is named even beside another's slow CPU; r's own pairs are kept when it has no other. Two
    nodes have one link between them and no other link to compare it with: never named here."""
    ok = {p: g for p, g in pair_gbps.items() if not (set(p) - {r}) & suspects}
    mine = [g for p, g in ok.items() if r in p] or [g for p, g in pair_gbps.items() if r in p]
    others = [g for p, g in ok.items() if r not in p]
    value = statistics.median(mine) if mine else None
    return value, _slow(value, others, margin)


def judge(cfg: Config, members: list[int], results: dict[int, dict[str, Any]], hosts: dict[int, str]) -> Verdict:
    """The verdict from every node's measurements (`results[rank]`: gflops, pairs {peer: {gbps, latency_ms}},
    all_gbps, all_latency_ms, error)."""
    expected = (range(len(cfg.expected_hosts)) if cfg.expected_hosts else
                range(cfg.nnodes_max) if cfg.node_rank is not None else [])
    rows: list[dict[str, Any]] = []
    links: dict[int, list[float]] = {r: [] for r in members}
    lat: dict[int, list[float]] = {r: [] for r in members}
    pair_gbps: dict[tuple[int, int], float] = {}
    for r in members:
        for peer, m in results.get(r, {}).get("pairs", {}).items():
            for a in (r, int(peer)):
                if a in links and m.get("gbps") is not None:
                    links[a].append(m["gbps"])
                    lat[a].append(m["latency_ms"])
            if m.get("gbps") is not None:
                pair_gbps[(min(r, int(peer)), max(r, int(peer)))] = m["gbps"]
    link = {r: statistics.median(v) if v else None for r, v in links.items()}
    gflops = {r: results.get(r, {}).get("gflops") for r in members}
    slow_cpu = {r: _slow(gflops[r], [v for k, v in gflops.items() if k != r and v is not None], cfg.margin)
                for r in members}
    # A slow or broken CPU slows every link of its node (gloo moves bytes on it): its pairs judge no other node.
    suspects = {r for r in members if slow_cpu[r] is not None or results.get(r, {}).get("error") or r not in results}
    for r in members:
        res = results.get(r, {})
        why = []
        if res.get("error") or r not in results:
            why.append(f"a test failed: {res.get('error') or 'no result'}")
        if slow_cpu[r] is not None:
            why.append(f"matmul {gflops[r]:.3g} GFLOP/s vs the others' {slow_cpu[r]:.3g}")
        mine, med = _slow_links(r, pair_gbps, suspects, cfg.margin)
        if med is not None:
            why.append(f"links {mine:.3g} GB/s vs the others' {med:.3g}")
        if cfg.min_gbps is not None and link[r] is not None and min(links[r]) < cfg.min_gbps:
            worst = min(links[r])
            why.append(f"a link at {worst:.3g} GB/s, under health.preflight_min_gbps = {cfg.min_gbps:g}")
        status = "broken" if res.get("error") or r not in results else "slow" if why else "ok"
        rows.append({"rank": r, "host": hosts.get(r, "?"), "gflops": gflops[r], "link_gbps": link[r],
                     "latency_ms": max(lat[r]) if lat[r] else None, "status": status, "why": "; ".join(why)})
    for r in expected:
        if r not in members:
            host = cfg.expected_hosts[r] if r < len(cfg.expected_hosts) else "?"
            rows.append({"rank": r, "host": host, "gflops": None, "link_gbps": None, "latency_ms": None,
                         "status": "broken", "why": f"did not join within {cfg.timeout:g} s"})
    rows.sort(key=lambda row: row["rank"])
    bad = [row["rank"] for row in rows if row["status"] != "ok"]
    good = [r for r in members if r not in bad]
    first = next((res for res in results.values() if res.get("all_gbps") is not None), {})
    verdict = Verdict("ok", rows, [], members, first.get("all_gbps"), first.get("all_latency_ms"))
    if len(members) < cfg.nnodes_min:
        verdict.action = "fail"
        verdict.message = f"{len(members)} of at least {cfg.nnodes_min} node(s) joined"
    elif bad and cfg.policy == "exclude" and len(good) >= cfg.nnodes_min:
        verdict.action, verdict.excluded = "exclude", [r for r in bad if r in members]
        verdict.message = f"left out: node(s) {', '.join(map(str, bad))}; {len(good)} train"
    elif bad and cfg.policy != "warn":
        verdict.action = "fail"
        verdict.message = f"node(s) {', '.join(map(str, bad))} slow or broken" + (
            f" and only {len(good)} good, fewer than launch.nnodes' minimum {cfg.nnodes_min}" if cfg.policy == "exclude" else "")
    elif bad:
        verdict.message = f"node(s) {', '.join(map(str, bad))} slow or broken (health.preflight_policy = warn: training on all)"
    return verdict


# -- the distributed part -----------------------------------------------------------------------

def _store(cfg: Config) -> Any:
    import torch.distributed as dist

    return dist.TCPStore(cfg.host, cfg.port, None, cfg.is_host, timedelta(seconds=cfg.timeout + 30),
                         wait_for_workers=False)


def _boot_id() -> str:
    try:
        return open("/proc/sys/kernel/random/boot_id", encoding="ascii").read().strip()
    except OSError:
        return socket.gethostname()


def _join(cfg: Config, store: Any) -> tuple[int, list[int], dict[int, str], int, int]:
    """(rank, members, rank -> host, this node's matmul turn, turns). Nodes on one machine (the same boot id:
    pods of one host, namespaces of one box) take their matmuls in turns, or they would measure each other."""
    rank = cfg.node_rank if cfg.node_rank is not None else int(store.add(PREFIX + "next", 1)) - 1
    store.set(f"{PREFIX}join/{rank}", json.dumps({"host": cfg.hostname, "node": cfg.node_name or cfg.hostname,
                                                  "boot": _boot_id()}))
    store.add(PREFIX + "joined", 1)
    if cfg.is_host:
        store.set(PREFIX + "members", json.dumps(_wait_for_nodes(cfg, store)))
    store.wait([PREFIX + "members"])
    members = json.loads(store.get(PREFIX + "members"))
    info = {r: json.loads(store.get(f"{PREFIX}join/{r}")) for r in members}
    boots = [info[r]["boot"] for r in members]
    mine = info[rank]["boot"] if rank in info else ""
    turn = [r for r in members if info[r]["boot"] == mine].index(rank) if rank in info else 0
    turns = max(boots.count(b) for b in boots) if boots else 1
    return rank, members, {r: i["node"] for r, i in info.items()}, turn, turns


def _wait_for_nodes(cfg: Config, store: Any) -> list[int]:
    """Until every node has joined, or the timeout; with a node range and no scheduler naming the nodes, only
    `JOIN_GRACE` past the minimum (where the scheduler names them, every one of them is waited for: a node of
    the allocation that is late is as bad as one that never comes)."""
    deadline = time.monotonic() + cfg.timeout
    enough_at: float | None = None
    want = min(cfg.nnodes_max, len(cfg.expected_hosts)) if cfg.expected_hosts else cfg.nnodes_max
    while True:
        n = int(store.add(PREFIX + "joined", 0))
        now = time.monotonic()
        if n >= cfg.nnodes_min and enough_at is None and not cfg.expected_hosts:
            enough_at = now
        if n >= want or now >= deadline or (enough_at is not None and now - enough_at >= JOIN_GRACE):
            break
        time.sleep(0.02)
    candidates = range(max(cfg.nnodes_max, n + 64)) if cfg.node_rank is None else range(cfg.nnodes_max)
    return [r for r in candidates if store.check([f"{PREFIX}join/{r}"])][: cfg.nnodes_max]


def _timed(fn: Any, reps: int, sync: Any) -> float:
    """Median seconds of `reps` calls of fn (after one warm-up)."""
    fn()
    sync()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _measure(cfg: Config, me: int, world: int, backend: str, turn: int = 0, turns: int = 1) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    out: dict[str, Any] = {"pairs": {}}
    for t in range(turns):  # at the same time on separate machines: no node measured beside another's traffic
        dist.barrier()
        if t == turn:
            out["gflops"] = _matmul(torch, cuda)
    size_mb = cfg.mb or (256 if cuda else 8)
    big = torch.ones(size_mb * (1 << 20) // 4, dtype=torch.float32, device=device)
    tiny = torch.ones(1, dtype=torch.float32, device=device)
    dist.barrier()
    out["all_latency_ms"] = _timed(lambda: dist.all_reduce(tiny), 10, sync) * 1e3
    seconds = _timed(lambda: dist.all_reduce(big), 3, sync)
    out["all_gbps"] = (2 * (world - 1) / world) * big.numel() * 4 / seconds / 1e9 if world > 1 else None
    out["pairs"] = _pairs(dist, me, world, big, tiny, sync)
    return out


def _pairs(dist: Any, me: int, world: int, big: Any, tiny: Any, sync: Any) -> dict[int, dict[str, float]]:
    """Every pair once, disjoint pairs at the same time; the lower rank of a pair keeps its numbers."""
    out = {}
    for pairs in rounds(world):
        for a, b in pairs:
            if me in (a, b):
                gbps, lat = _ping_pong(dist, big, tiny, b if me == a else a, first=me == a, sync=sync)
                if me == a:
                    out[b] = {"gbps": gbps, "latency_ms": lat}
        dist.barrier()
    return out


def _ping_pong(dist: Any, big: Any, tiny: Any, peer: int, first: bool, sync: Any) -> tuple[float, float]:
    def exchange(t: Any) -> None:
        if first:
            dist.send(t, peer)
            dist.recv(t, peer)
        else:
            dist.recv(t, peer)
            dist.send(t, peer)

    t_big = _timed(lambda: exchange(big), 2, sync)
    t_tiny = _timed(lambda: exchange(tiny), 10, sync)
    return 2 * big.numel() * 4 / t_big / 1e9, t_tiny / 2 * 1e3


MATMUL_SECONDS = 0.3  # per device: long enough that a throttled or shared CPU/GPU shows its real rate
WINDOWS = 3


def _matmul(torch: Any, cuda: bool) -> float:
    """GFLOP/s of the slowest device of this node: back-to-back matmuls for about `MATMUL_SECONDS`."""
    devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if cuda else [torch.device("cpu")]
    return min(_device_rate(torch, device, cuda) for device in devices)


def _device_rate(torch: Any, device: Any, cuda: bool) -> float:
    n = 4096 if cuda else 384
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16 if cuda else torch.float32)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    window = MATMUL_SECONDS / WINDOWS
    one = _timed(lambda: a @ a, 1, sync)
    # Windows of wall time, the clock read after every matmul on a CPU: under a CPU quota the process runs a few
    # ms of each 100 ms period, so a count of matmuls sized by one that ran inside such a burst either fits in
    # the next burst (the full rate, the quota unseen) or stretches over seconds. On a GPU, launches between syncs.
    chunk = max(1, min(100, int(window / 10 / max(one, 1e-6)))) if cuda else 1
    best = 0.0
    for _ in range(WINDOWS):  # the best window: the device's rate, not a neighbour's burst
        done, t = 0, time.perf_counter()
        while done == 0 or time.perf_counter() - t < window:
            for _ in range(chunk):
                a @ a
            sync()
            done += chunk
        best = max(best, 2 * n**3 * done / (time.perf_counter() - t) / 1e9)
    return best


def _gloo_interface(store_host: str) -> str | None:
    """The interface this node reaches the store host through (IPv4; None when unknown). gloo otherwise binds
    to what the hostname resolves to, which in a container or namespace is often loopback."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((store_host, 9))  # no packet: picks the route and so the local address
            local = probe.getsockname()[0]
        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                try:
                    packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
                except OSError:
                    continue
            if socket.inet_ntoa(packed[20:24]) == local:
                return name
    except OSError:
        return None
    return None


def run_node(cfg: Config) -> tuple[int, Verdict]:
    """This node's part; (its rank, the verdict every node got)."""
    import torch
    import torch.distributed as dist

    began = time.monotonic()
    backend = cfg.backend if cfg.backend != "auto" else ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
        iface = _gloo_interface(cfg.host)
        if iface:
            os.environ["GLOO_SOCKET_IFNAME"] = iface
    store = _store(cfg)
    rank, members, hosts, turn, turns = _join(cfg, store)
    joined = time.monotonic()
    if rank not in members:
        if len(members) >= cfg.nnodes_max:  # the job is full: a spare (launch/spares.py), not a bad node
            return rank, Verdict("spare", [], [], members, message=f"the preflight has its {len(members)} node(s): "
                                 f"node {rank} is not tested and goes on to wait as a spare")
        return rank, Verdict("exclude", [], [rank], members, message=f"node {rank} joined too late")
    result: dict[str, Any]
    if len(members) >= cfg.nnodes_min:
        try:
            if backend == "nccl":
                torch.cuda.set_device(0)
            dist.init_process_group(backend, store=dist.PrefixStore(PREFIX + "pg", store), rank=members.index(rank),
                                    world_size=len(members), timeout=timedelta(seconds=cfg.timeout))
            result = _measure(cfg, members.index(rank), len(members), backend, turn, turns)
            result["pairs"] = {str(members[p]): m for p, m in result["pairs"].items()}
        except Exception as err:  # noqa: BLE001 - a failed test is a finding about a node, not a crash
            result = {"error": f"{type(err).__name__}: {err}"[:300]}
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    else:
        result = {}
    store.set(f"{PREFIX}result/{rank}", json.dumps(result))
    tested = time.monotonic()
    if cfg.is_host:
        results = _collect(cfg, store, members)
        verdict = judge(cfg, members, results, hosts)
        verdict.backend = backend
        store.set(PREFIX + "verdict", json.dumps(verdict.to_json()))
    store.wait([PREFIX + "verdict"])
    verdict = Verdict(**json.loads(store.get(PREFIX + "verdict")))
    verdict.seconds = time.monotonic() - began
    verdict.phases = {"join": joined - began, "tests": tested - joined, "verdict": time.monotonic() - tested}
    store.add(PREFIX + "done", 1)
    if cfg.is_host:  # the store lives until every node has read the verdict
        deadline = time.monotonic() + 10
        while int(store.add(PREFIX + "done", 0)) < len(members) and time.monotonic() < deadline:
            time.sleep(0.02)
    return rank, verdict


def _collect(cfg: Config, store: Any, members: list[int]) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + cfg.timeout
    results: dict[int, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(results) < len(members):
        for r in members:
            if r not in results and store.check([f"{PREFIX}result/{r}"]):
                results[r] = json.loads(store.get(f"{PREFIX}result/{r}"))
        time.sleep(0.02)
    return results


def main(argv: list[str]) -> int:
    cfg = Config(**{**json.loads(argv[0]), "expected_hosts": tuple(json.loads(argv[0]).get("expected_hosts", ()))})
    try:
        rank, verdict = run_node(cfg)
        doc = {"rank": rank, "verdict": verdict.to_json()}
    except Exception as err:  # noqa: BLE001 - the caller renders it
        doc = {"rank": cfg.node_rank, "error": f"{type(err).__name__}: {err}"}
    print(json.dumps(doc), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
