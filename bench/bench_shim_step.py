"""Per-step cost of the resctl shim's optimizer-step hook, measured side by side in one process.

A tiny model (one Linear layer) and SGD make each step a few tens of microseconds, so any per-step
cost of the shim shows. Blocks of steps alternate: no shim hook, then the shim's hook
(`Shim.on_optimizer_step`: step events into a real events file, heartbeats to a real NVRx rank
monitor server started here as ft_launcher starts it); the result is the median step time of
each and their difference (target: <= 20 us).

    python bench/bench_shim_step.py --blocks 20 --steps 500
    python bench/bench_shim_step.py --hook-only 20000     # the hook's call alone
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def start_rank_monitor(tmp: Path) -> object:
    """A real NVRx rank monitor server, as ft_launcher starts one per local rank."""
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.data import FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

    socket = str(tmp / "rmon.socket")
    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=1200.0, rank_heartbeat_timeout=900.0)
    proc = RankMonitorServer.run_in_subprocess(cfg, socket)
    os.environ[FT_RANK_MONITOR_IPC_SOCKET_ENV_VAR] = socket
    return proc


def steps_times(step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=20, help="alternating blocks of each kind")
    ap.add_argument("--steps", type=int, default=500, help="steps per block")
    ap.add_argument("--no-monitor", action="store_true", help="no rank monitor (heartbeats off)")
    ap.add_argument("--hook-only", type=int, metavar="N", help="time N calls of the hook alone (no step): its own cost, "
                    "without the step's noise; prints the best of 7 rounds' mean")
    args = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}.items():
        os.environ.setdefault(k, v)
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from resctl.profile.schema import Profile
    from resctl.shim.runtime import Shim

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="bench-shim-"))
    monitor = None if args.no_monitor else start_rank_monitor(tmp)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 8)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        model(x).sum().backward()
        opt.step()

    shim = Shim(Profile(), tmp / "run")
    shim.heartbeats.connect()
    if args.hook_only:
        hook = shim.on_optimizer_step
        rounds = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(args.hook_only):
                hook()
            rounds.append((time.perf_counter() - t0) / args.hook_only)
        print(f"hook alone: {min(rounds) * 1e6:.2f} us a call (best of 7 rounds of {args.hook_only}; "
              f"median {statistics.median(rounds) * 1e6:.2f} us)")
        shim.finish("ok")
        shim.events.close()
        if monitor is not None:
            monitor.terminate()  # type: ignore[attr-defined]
        return 0
    steps_times(step, 200)  # warm-up
    plain: list[float] = []
    hooked: list[float] = []
    for _ in range(args.blocks):
        plain += steps_times(step, args.steps)
        handle = register_optimizer_step_post_hook(shim.on_optimizer_step)
        hooked += steps_times(step, args.steps)
        handle.remove()
    shim.finish("ok")
    shim.events.close()
    lines = sum(1 for _ in open(tmp / "run" / "events-rank0.jsonl"))
    p50, h50 = statistics.median(plain), statistics.median(hooked)
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, heartbeats "
          f"{'to a real rank monitor' if monitor else 'off'}; {args.blocks} x {args.steps} steps each")
    print(f"median step: no shim {p50 * 1e6:.1f} us, shim {h50 * 1e6:.1f} us, overhead {(h50 - p50) * 1e6:+.1f} us")
    print(f"mean step:   no shim {statistics.fmean(plain) * 1e6:.1f} us, shim {statistics.fmean(hooked) * 1e6:.1f} us")
    print(f"events written: {lines} lines for {shim.step} steps (+ end)")
    assert lines == shim.step + 1, "every step event is in the file at the end"
    if monitor is not None:
        monitor.terminate()  # type: ignore[attr-defined]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
