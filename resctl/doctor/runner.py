"""Runs the selected probes, each in a worker thread with a deadline, and collects a Report.

Light probes run at the same time; heavy ones (the storage throughput test, anything under
--deep) run one after another afterwards so they do not skew each other's numbers. A probe
that passes its deadline is reported as FAIL "did not finish" and abandoned (its thread is a
daemon; its cancel event tells loops to stop): a hung driver call cannot hang the doctor.
"""

from __future__ import annotations

import socket
import threading
import time
import traceback
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Callable, Sequence

from resctl.doctor import clock, dns, efa, env, gpu, grace, memlock, memory, nvlink, shm, storage
from resctl.doctor.context import Context
from resctl.doctor.result import Check, ProbeResult, Report, Skip, Status
from resctl.errors import UsageError
from resctl.profile import contract

#: Multiplier of doctor.timeout for heavy probes.
HEAVY_TIMEOUT = 6.0


@dataclass(frozen=True)
class Probe:
    """A registered probe: `run(ctx)` returns its checks; heavy ones run alone."""

    name: str
    summary: str
    run: Callable[[Context], list[Check]]
    heavy: Callable[[Context], bool] = lambda ctx: False
    wait: Callable[[Context], float] = lambda ctx: 0.0  # seconds the probe may wait on purpose, added to its deadline


PROBES: dict[str, Probe] = {p.name: p for p in (
    Probe("gpu", "count, model, driver, memory, ECC, remaps, thermals (NVML); --deep: matmul, copies", gpu.run,
          lambda ctx: ctx.deep),
    Probe("nvlink", "active links and errors per GPU; --deep: GPU-to-GPU bandwidth", nvlink.run, lambda ctx: ctx.deep),
    Probe("efa", "EFA/InfiniBand devices, ports, uverbs, fi_info, FI_* env", efa.run),
    Probe("storage", "checkpoint dir: mount, free space, write+fsync+read throughput, Lustre health", storage.run,
          lambda ctx: ctx.expect.storage_test_mb > 0),
    Probe("shm", "/dev/shm size and free space", shm.run),
    Probe("memlock", "locked-memory ulimit (RDMA needs unlimited)", memlock.run),
    Probe("env", "NCCL/NVRx environment (NCCL_NVLS_ENABLE with in-process restart, ...)", env.run),
    Probe("dns", "rendezvous host and own hostname resolve (waiting up to doctor.dns_wait)", dns.run,
          wait=lambda ctx: ctx.profile.doctor.dns_wait),
    Probe("clock", "wall clock, NTP sync, clock source", clock.run),
    Probe("memory", "host memory available for checkpoint staging", memory.run),
    Probe("grace", "final save < launcher term timeout < the scheduler's grace", grace.run),
)}


def select(only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[str]:
    """Probe names to run, in registry order.

    Raises:
        UsageError: an unknown name (with a suggestion), or nothing left to run.
    """
    for name in [*only, *skip]:
        if name not in PROBES:
            close = get_close_matches(name, PROBES, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise UsageError(f"unknown probe {name!r}{hint} (probes: {', '.join(PROBES)})")
    names = [n for n in PROBES if (not only or n in only) and n not in skip]
    if not names:
        raise UsageError("--only/--skip leave no probe to run")
    return names


def _run_one(probe: Probe, ctx: Context, timeout: float) -> ProbeResult:
    view = ctx.for_probe()
    box: dict[str, list[Check]] = {}

    def work() -> None:
        try:
            box["checks"] = probe.run(view)
        except Skip as err:
            box["checks"] = [Check("-", Status.SKIP, str(err))]
        except Exception as err:  # noqa: BLE001 - a probe bug must not take the doctor down; it is not a pass either
            box["checks"] = [Check("-", Status.FAIL, f"probe error: {type(err).__name__}: {err}", fix=
                                   "rerun with RESCTL_DEBUG=1 for the traceback and report it")]
            if view.env.get(contract.DEBUG) == "1":
                traceback.print_exc()

    t0 = time.monotonic()
    thread = threading.Thread(target=work, name=f"doctor-{probe.name}", daemon=True)
    thread.start()
    thread.join(timeout)
    elapsed = time.monotonic() - t0
    if thread.is_alive():
        view.cancel.set()
        return ProbeResult(probe.name, [Check("-", Status.FAIL, f"did not finish within {timeout:g}s (hung driver "
                                              "call or stalled storage?)", round(elapsed, 1), timeout, "s",
                                              "find the stuck component (nvidia-smi, dmesg, the mount); raise "
                                              "doctor.timeout if the node is just slow")],
                           elapsed, timed_out=True)
    return ProbeResult(probe.name, box["checks"], elapsed)


def _start(probe: Probe, ctx: Context, timeout: float) -> tuple[threading.Thread, dict[str, ProbeResult]]:
    box: dict[str, ProbeResult] = {}
    t = threading.Thread(target=lambda: box.__setitem__("r", _run_one(probe, ctx, timeout)), daemon=True)
    t.start()
    return t, box


def run(ctx: Context, names: Sequence[str], on_done: Callable[[ProbeResult], None] | None = None) -> Report:
    """Run the named probes and return the Report (probes in registry order)."""
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    base = ctx.expect.timeout_s
    probes = [PROBES[n] for n in names]
    results: dict[str, ProbeResult] = {}
    light = [p for p in probes if not p.heavy(ctx)]
    # each light probe is watched by its own thread, so all deadlines run concurrently
    started_light = [(p, *_start(p, ctx, base + p.wait(ctx))) for p in light]
    for p, t, box in started_light:
        t.join()
        results[p.name] = box["r"]
        if on_done:
            on_done(box["r"])
    for p in probes:
        if p.heavy(ctx):
            results[p.name] = _run_one(p, ctx, base * HEAVY_TIMEOUT)
            if on_done:
                on_done(results[p.name])
    return Report([results[n] for n in names], time.monotonic() - t0, socket.gethostname(), str(ctx.root),
                  started, ctx.deep, ctx.expect.to_json())
