"""Recovery coordination at N simulated nodes (issues 25, 30): the real pieces, threads for nodes.

    nice -n 10 python -m bench.scale --n 8,64,256,1024 --rdzv-max 256 --out bench/scale/results.json
    nice -n 10 python -m bench.scale --n 8,64,256,1024 --owned replace,known,silent --out bench/scale/results-owned.json
    nice -n 10 python -m bench.scale --n 8,64,256,1024 --store loss --out bench/scale/results-store.json
    python -m bench.scale --table bench/scale/results.json      # the tables again, from the file

Phases (see docs/BENCHMARKS.md, "Recovery coordination at scale"):

- rendezvous, resctl's (the default rendezvous, `launch.rendezvous = "auto"`): `resctl.launch.owned_rdzv`
  (bench/scale/owned.py): the job's first round, one node lost, the restart round with a replacement
  node (`replace`), or none and the loss known (`known`) or silent (`silent`); `--owned` runs only these.
- rendezvous, NVRx 0.4.1's (the opt-out, `launch.rendezvous = "nvrx"`): `FtRendezvousHandler` +
  `C10dRendezvousBackend`, one per node (bench/scale/rdzv.py), the same scenario with a replacement
  (plus the agent's rank-assignment all-gather and master keys), up to `--rdzv-max` (O(N^2) work).
- the rendezvous store lost and replaced (`launch.store = "external"`, issue 42; bench/scale/storeloss.py):
  N nodes in a formed round polling through the store guard, the `resctl store` process SIGKILLed, every
  node's detection; a new store on the same port and round 0 from scratch; `--store loss` runs only these.
- stop step: `resctl.shim.stopstep` after and before (bench/scale/legacy_stopstep.py) issue 25.
- load agreement: candidates, common memory steps, buddy address, verdict (bench/scale/coord.py).

Every phase reports wall time, CPU time of the harness process and of the store process, store
round trips and bytes per participant (machine-independent), and the store's peak RSS and
connections. On a 2-core shared VM the wall times of many threads are an upper bound: where the
client CPU time is close to the wall time, the harness (one GIL for N simulated machines) is the
limit, not the protocol.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Callable


def classify(ns: list[int], ys: list[float]) -> str:
    """The growth that fits `ys` over `ns` best: O(1), O(log N), O(N) or O(N^2) (least squares of
    y = a + b g(N), relative residuals; flat within 50 % over the range is O(1))."""
    pts = [(n, y) for n, y in zip(ns, ys) if isinstance(y, (int, float)) and y > 0]
    if len(pts) < 3:
        return "-"
    lo, hi = min(y for _, y in pts), max(y for _, y in pts)
    if hi <= 1.5 * lo or pts[-1][1] <= 1.5 * pts[0][1]:
        return "O(1)"
    best, best_err = "-", math.inf
    for name, g in (("O(log N)", math.log2), ("O(N)", float), ("O(N^2)", lambda n: float(n) ** 2)):
        xs = [g(n) for n, _ in pts]
        mx, my = sum(xs) / len(xs), sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, (_, y) in zip(xs, pts)) / sxx if sxx else 0.0
        a = my - b * mx
        if b <= 0:
            continue
        err = sum(((a + b * x) - y) ** 2 / y**2 for x, (_, y) in zip(xs, pts))
        if err < best_err:
            best, best_err = name, err
    return best


def _run(results: dict[str, Any], key: str, n: int, fn: Callable[[], dict[str, Any]]) -> None:
    t0 = time.monotonic()
    print(f"[scale] {key} N={n} ...", file=sys.stderr, flush=True)
    try:
        row = fn()
    except Exception as err:  # noqa: BLE001 - one phase failing does not lose the others
        row = {"n": n, "error": repr(err)[:300]}
    row["harness_s"] = round(time.monotonic() - t0, 2)
    results.setdefault(key, []).append(row)
    print(f"[scale] {key} N={n}: {json.dumps(row)[:400]}", file=sys.stderr, flush=True)


#: The all-gathers before issue 25 hold N x 2 KB per rank at once: 32 GB for 4096 threads here.
AGREE_BEFORE_MAX = 1024


#: resctl's rendezvous (the default) in every full run: these variants at every N.
OWNED_VARIANTS = ("replace", "known", "silent")


def measure(ns: list[int], rdzv_max: int, before_max: int, out: Path, coordination: bool = True,
            repeats: int = 1, owned_variants: tuple[str, ...] = OWNED_VARIANTS) -> dict[str, Any]:
    from bench.scale import coord, owned, rdzv

    results: dict[str, Any] = {
        "machine": "dev VM (2 cores, shared)", "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "ns": ns,
    }
    for n in ns:
        if coordination:
            _run(results, "stop_after", n, lambda: coord.stop_step(n, "after", repeats))
            if n <= before_max:
                _run(results, "stop_before", n, lambda: coord.stop_step(n, "before", repeats))
            _run(results, "agree_after", n, lambda: coord.ckpt_agree(n, "after"))
            if n <= min(before_max, AGREE_BEFORE_MAX):
                _run(results, "agree_before", n, lambda: coord.ckpt_agree(n, "before"))
        for variant in owned_variants:  # the default rendezvous
            _run(results, f"owned_{variant}", n, lambda: owned.scenario(n, variant))
            out.write_text(json.dumps(results, indent=1))
        _run(results, "rdzv_state", n, lambda: rdzv.state_cost(n))
        if n <= rdzv_max:
            _run(results, "rendezvous", n, lambda: rdzv.scenario(n))
        out.write_text(json.dumps(results, indent=1))
    return results


#: Round-trip time assumed for the critical-path estimate (a data-centre network, one hop; loopback
#: here is ~30 us).
RTT_S = 100e-6


def critical_path(row: dict[str, Any]) -> float:
    """What the phase would take on N real machines: the store's serial work (its CPU time, measured),
    one machine's share of the client work, and one rank's round trips in sequence at RTT_S."""
    n = row["n"]
    return row["store"]["cpu_s"] + row["client_cpu_s"] / n + row["per_rank"]["round_trips"] * RTT_S


def _get(rows: list[dict[str, Any]], n: int, path: str) -> Any:
    for row in rows:
        if row.get("n") == n and "error" in row:
            return "failed"
        if row.get("n") == n:
            if path == "critical":
                return critical_path(row)
            if path == "rdzv_bound":  # 2N read-modify-writes in sequence, the keep-alive expiry, a 1 s poll
                return 2 * n * (row["rmw_cpu_s"] + RTT_S) + 15.0 + 1.0
            value: Any = row
            for part in path.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            return value
    return None


SERIES = (
    # (label, key, field, unit)
    ("rendezvous: first round (all nodes join)", "rendezvous", "start_round_s", "s"),
    ("rendezvous: restart round after a node loss, beyond the 15 s keep-alive expiry", "rendezvous",
     "restart_after_expiry_s", "s"),
    ("rendezvous: restart round, store round trips per node", "rendezvous", "restart_round.round_trips", ""),
    ("rendezvous: restart round, bytes per node", "rendezvous", "restart_round.bytes", "B"),
    ("rendezvous: restart round, compare-and-set attempts per node", "rendezvous", "restart_round.compare_set", ""),
    ("rendezvous: harness CPU of the restart round", "rendezvous", "restart_round_cpu_s", "s"),
    ("launcher monitor poll (num_nodes_waiting: one state read)", "rendezvous", "poll_s_p50", "s", False),
    ("rendezvous state size (a complete round)", "rdzv_state", "state_bytes", "B"),
    ("rendezvous state: one read-modify-write, CPU", "rdzv_state", "rmw_cpu_s", "s"),
    ("restart round, lower bound on N machines: 15 s expiry + 1 s poll + 2N x (RMW + RTT)", "rdzv_state",
     "rdzv_bound", "s"),
    ("resctl rendezvous, first round (all nodes join)", "owned_replace", "start_round_s", "s", False),
    ("resctl rendezvous, restart round, a replacement node (N:N), wall in the harness", "owned_replace",
     "restart_round_s", "s", False),
    ("resctl rendezvous, restart round, no replacement, loss known (1:N), wall", "owned_known", "restart_round_s",
     "s", False),
    ("resctl rendezvous, restart round, no replacement, loss silent (1:N, 1 s x 3 keep-alive), wall", "owned_silent",
     "restart_round_s", "s", False),
    ("resctl rendezvous, restart round (replace), critical path on N machines (estimate)", "owned_replace",
     "critical_s", "s"),
    ("resctl rendezvous, restart round (known), critical path on N machines (estimate)", "owned_known",
     "critical_s", "s"),
    ("resctl rendezvous, restart round (replace), store round trips per node", "owned_replace",
     "restart_round.round_trips", ""),
    ("resctl rendezvous, restart round (replace), bytes per node", "owned_replace", "restart_round.bytes", "B"),
    ("resctl rendezvous, restart round (replace), compare-and-sets per node", "owned_replace",
     "restart_round.compare_set", ""),
    ("resctl rendezvous, restart round (replace), harness CPU", "owned_replace", "restart_round_cpu_s", "s"),
    ("resctl rendezvous, restart round (replace), store CPU", "owned_replace", "store.cpu_s", "s"),
    ("resctl rendezvous, restart round (replace), store connections", "owned_replace", "store.connections", ""),
    ("resctl rendezvous, restart round (replace), store peak RSS", "owned_replace", "store.rss_peak_mb", "MB"),
    ("resctl rendezvous, survivors that kept their rank (replace)", "owned_replace", "survivors_kept_rank", ""),
    ("resctl rendezvous, monitor poll (num_nodes_waiting: one add)", "owned_replace", "poll_s_p50", "s", False),
    ("resctl rendezvous, typed state read once (peer stop, spare, preflight wait)", "owned_replace", "state_read_s",
     "s", False),
    ("resctl rendezvous, typed state read, store round trips", "owned_replace", "state_read.round_trips", ""),
    ("resctl rendezvous, typed state read, bytes", "owned_replace", "state_read.bytes", "B"),
    ("store lost: kill -> last node detected (monitor poll every interval_s), wall in the harness", "store_lost",
     "detect_raw_s", "s", False),
    ("store lost: kill -> detected, median node, wall", "store_lost", "detect_raw_p50_s", "s", False),
    ("store lost: the failed poll -> detected, last node (net of the poll's wait), wall", "store_lost",
     "detect_net_s", "s", False),
    ("store lost: the failed poll -> detected, median node (net), wall", "store_lost", "detect_net_p50_s", "s", False),
    ("store lost: harness CPU from the kill to the last detection", "store_lost", "detect_cpu_s", "s"),
    ("store lost: critical path on N machines, net of the poll's wait (estimate)", "store_lost", "critical_s", "s"),
    ("store healthy: monitor polls per node per poll interval", "store_lost", "polls_per_interval", ""),
    ("store healthy: store round trips per node per poll interval (poll + keep-alive)", "store_lost",
     "per_interval.round_trips", ""),
    ("store healthy: bytes per node per poll interval", "store_lost", "per_interval.bytes", "B"),
    ("store healthy: of them, the peer watch's reads per node per poll interval (get)", "store_lost",
     "per_interval.get", ""),
    ("store healthy, the peer watch off: store round trips per node per poll interval", "store_lost",
     "per_interval_no_watch.round_trips", ""),
    ("store healthy: harness CPU over the window", "store_lost", "healthy_cpu_s", "s"),
    ("store healthy: store CPU over the window", "store_lost", "store.cpu_s", "s"),
    ("store healthy, the peer watch off: store CPU over the window", "store_lost", "store_no_watch.cpu_s", "s"),
    ("store healthy: store connections", "store_lost", "store.connections", ""),
    ("store healthy: store peak RSS", "store_lost", "store.rss_peak_mb", "MB"),
    ("store replaced: process start -> serving (python + torch import)", "store_replaced", "store_start_s", "s",
     False),
    ("store replaced: serving -> round 0 complete at every node, wall in the harness", "store_replaced",
     "ready_to_round_s", "s", False),
    ("store replaced: of it, N nodes connecting one after another (harness)", "store_replaced", "connect_s", "s",
     False),
    ("store replaced: one node's connections (client, keep-alive), median", "store_replaced", "connect_node_p50_s",
     "s", False),
    ("store replaced: connections that stalled 5 s (the client's reverse DNS lookups, this VM)", "store_replaced",
     "connect_stalls", "", False),
    ("store replaced: of it, round 0 (all nodes join), wall", "store_replaced", "round_s", "s", False),
    ("store replaced: critical path on N machines, serving -> round complete (estimate)", "store_replaced",
     "critical_s", "s"),
    ("store replaced: store round trips per node", "store_replaced", "round.round_trips", ""),
    ("store replaced: bytes per node", "store_replaced", "round.bytes", "B"),
    ("store replaced: harness CPU of the round", "store_replaced", "round_cpu_s", "s"),
    ("store replaced: store CPU, serving -> round complete", "store_replaced", "store.cpu_s", "s"),
    ("store replaced: store connections", "store_replaced", "store.connections", ""),
    ("store replaced: store peak RSS", "store_replaced", "store.rss_peak_mb", "MB"),
    ("stop step, before: signal -> last rank agreed", "stop_before", "wall_s", "s", False),
    ("stop step, after: signal -> last rank agreed", "stop_after", "wall_s", "s", False),
    ("stop step, before: critical path on N machines (estimate)", "stop_before", "critical", "s"),
    ("stop step, after: critical path on N machines (estimate)", "stop_after", "critical", "s"),
    ("stop step, before: harness CPU", "stop_before", "client_cpu_s", "s"),
    ("stop step, after: harness CPU", "stop_after", "client_cpu_s", "s"),
    ("stop step, before: store CPU", "stop_before", "store.cpu_s", "s"),
    ("stop step, after: store CPU", "stop_after", "store.cpu_s", "s"),
    ("stop step, before: round trips per rank", "stop_before", "per_rank.round_trips", ""),
    ("stop step, after: round trips per rank", "stop_after", "per_rank.round_trips", ""),
    ("stop step, before: keys read or written at the store per rank", "stop_before", "per_rank.keys", ""),
    ("stop step, after: keys read or written at the store per rank", "stop_after", "per_rank.keys", ""),
    ("stop step, before: bytes per rank", "stop_before", "per_rank.bytes", "B"),
    ("stop step, after: bytes per rank", "stop_after", "per_rank.bytes", "B"),
    ("stop step, after: store connections", "stop_after", "store.connections", ""),
    ("stop step, after: store peak RSS", "stop_after", "store.rss_peak_mb", "MB"),
    ("gloo groups in threads: group creation (torch)", "gloo", "create_s", "s", False),
    ("gloo: load agreement before (all-gathers)", "gloo", "before_s", "s", False),
    ("gloo: load agreement after (agree.py)", "gloo", "after_s", "s", False),
    ("load agreement, before (all-gathers)", "agree_before", "wall_s", "s", False),
    ("load agreement, after (agree.py)", "agree_after", "wall_s", "s", False),
    ("load agreement, before: critical path on N machines (estimate)", "agree_before", "critical", "s"),
    ("load agreement, after: critical path on N machines (estimate)", "agree_after", "critical", "s"),
    ("load agreement, before: store CPU", "agree_before", "store.cpu_s", "s"),
    ("load agreement, after: store CPU", "agree_after", "store.cpu_s", "s"),
    ("load agreement, before: round trips per rank", "agree_before", "per_rank.round_trips", ""),
    ("load agreement, after: round trips per rank", "agree_after", "per_rank.round_trips", ""),
    ("load agreement, before: bytes per rank", "agree_before", "per_rank.bytes", "B"),
    ("load agreement, after: bytes per rank", "agree_after", "per_rank.bytes", "B"),
    ("load agreement, before: store peak RSS", "agree_before", "store.rss_peak_mb", "MB"),
    ("load agreement, after: store peak RSS", "agree_after", "store.rss_peak_mb", "MB"),
)


def _fmt(v: Any, unit: str) -> str:
    if v is None or isinstance(v, str):
        return v or "-"
    if unit == "s":
        return f"{v:.3f}" if v < 10 else f"{v:.1f}"
    if unit == "B":
        return f"{v / 1e6:.2f} MB" if v >= 1e6 else f"{v / 1e3:.1f} KB" if v >= 1e3 else f"{v:.0f} B"
    if unit == "MB":
        return f"{v:.0f}"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def table(results: dict[str, Any]) -> str:
    ns = results["ns"]
    head = "| measure | " + " | ".join(f"N={n}" for n in ns) + " | growth |"
    lines = [head, "|---|" + "---|" * (len(ns) + 1)]
    for label, key, path, unit, *fit in SERIES:
        rows = results.get(key, [])
        values = [_get(rows, n, path) for n in ns]
        if all(v is None for v in values):
            continue
        # Wall times of N threads on 2 shared cores are scheduling noise: no growth is read from them.
        growth = classify(ns, values) if not fit or fit[0] else "(wall: noise)"
        unit_s = f" ({unit})" if unit in ("s", "MB") else ""
        lines.append(f"| {label}{unit_s} | " + " | ".join(_fmt(v, unit) for v in values) + f" | {growth} |")
    return "\n".join(lines)


def _store(ns: list[int], poll: float, out: Path) -> dict[str, Any]:
    """The store lost, then replaced on the same port, at each N (bench/scale/storeloss.py)."""
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # torch's C++ traceback per failed request, x 2N
    from bench.scale import storeloss

    results: dict[str, Any] = {"machine": "dev VM (2 cores, shared)", "python": platform.python_version(), "ns": ns,
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "poll_s": poll}
    for n in ns:
        port = storeloss.free_port()
        _run(results, "store_lost", n, lambda: storeloss.lost(n, port, poll))
        _run(results, "store_replaced", n, lambda: storeloss.replaced(n, port))
        out.write_text(json.dumps(results, indent=1))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", default="8,64,256,1024", help="simulated sizes, comma-separated")
    parser.add_argument("--rdzv-max", type=int, default=256, help="largest N for NVRx's rendezvous (O(N^2) work)")
    parser.add_argument("--before-max", type=int, default=1024, help="largest N for the pre-issue-25 versions")
    parser.add_argument("--repeats", type=int, default=1, help="stops per size (the median wall time is kept)")
    parser.add_argument("--rdzv-only", action="store_true", help="only the rendezvous phases (resctl's, then NVRx's "
                                                                     "up to --rdzv-max)")
    parser.add_argument("--owned", help="instead: only resctl's rendezvous at --n, these variants (replace,known,silent)")
    parser.add_argument("--store", choices=["loss"], help="instead: the rendezvous store lost and replaced at --n "
                                                           "(issue 42)")
    parser.add_argument("--poll", type=float, default=0.5, help="--store: the launchers' monitor interval (s)")
    parser.add_argument("--out", type=Path, default=Path("bench/scale/results.json"))
    parser.add_argument("--table", type=Path, help="print the tables of a results file and exit")
    parser.add_argument("--gloo", help="instead: load's agreement on real gloo groups in threads at these N "
                                       "(a full mesh in one process: up to ~64)")
    args = parser.parse_args(argv)
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return 0
    if args.gloo:
        from bench.scale import gloo

        ns = [int(x) for x in args.gloo.split(",")]
        results: dict[str, Any] = {"ns": ns, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        for n in ns:
            _run(results, "gloo", n, lambda: gloo.run(n))
        args.out.write_text(json.dumps(results, indent=1))
        print(table(results))
        return 0
    ns = [int(x) for x in args.n.split(",")]
    if args.store:
        results = _store(ns, args.poll, args.out)
        print(table(results))
        return 0
    if args.owned:
        from bench.scale import owned

        results = {"machine": "dev VM (2 cores, shared)", "python": platform.python_version(), "ns": ns,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        for n in ns:
            for variant in args.owned.split(","):
                _run(results, f"owned_{variant}", n, lambda: owned.scenario(n, variant))
                args.out.write_text(json.dumps(results, indent=1))
        print(table(results))
        return 0
    results = measure(ns, args.rdzv_max, args.before_max, args.out, coordination=not args.rdzv_only,
                      repeats=args.repeats)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
