"""NVLink probe: active links per GPU against doctor.nvlinks_per_gpu, and link error counters;
with --deep, GPU-to-GPU copy bandwidth between neighbours.

Verdicts:
  links    FAIL a GPU with fewer active links than expected (NCCL falls back to slower paths or
           the fabric partitions); PASS when nothing is expected; SKIP on GPUs without NVLink.
  errors   WARN replay, recovery or CRC errors on a link (a flaky link ahead of a hang).
  (--deep) p2p: FAIL a copy that errors; WARN a pair below 80 % of the node's median.
"""

from __future__ import annotations

import statistics

from resctl.doctor import deep
from resctl.doctor.context import Context
from resctl.doctor.nvml import NvmlUnavailable
from resctl.doctor.result import Check, Skip, Status


def run(ctx: Context) -> list[Check]:
    try:
        gpus = ctx.nvml().gpus()
    except NvmlUnavailable as err:
        raise Skip(f"no NVIDIA driver: {err}") from err
    if not gpus:
        raise Skip("no GPUs")
    want = ctx.expect.nvlinks_per_gpu
    active = {g.index: sum(1 for link in g.nvlinks if link.active) for g in gpus}
    if not any(g.nvlinks for g in gpus) and not want:
        raise Skip(f"no NVLink on {gpus[0].name}")
    checks = []
    short = [(i, n) for i, n in active.items() if want is not None and n < want]
    if short:
        detail = ", ".join(f"GPU {i}: {n}/{want}" for i, n in short)
        down = [f"{g.index}.{link.link}" for g in gpus for link in g.nvlinks if not link.active]
        checks.append(Check("links", Status.FAIL, f"links down ({detail})" + (f"; inactive GPU.link: "
                            f"{', '.join(down[:8])}" if down else ""), min(active.values()), want, "links/GPU",
                            "drain the node and have the NVLink/NVSwitch fabric checked (nvidia-smi nvlink -s, "
                            "fabric manager logs)"))
    else:
        lo, hi = min(active.values()), max(active.values())
        checks.append(Check("links", Status.PASS, f"{lo} active on every GPU" if lo == hi
                            else f"{lo}-{hi} active per GPU", lo, want, "links/GPU"))
    noisy = [(g.index, link.link, (link.replay or 0), (link.recovery or 0), (link.crc or 0))
             for g in gpus for link in g.nvlinks if (link.replay or 0) + (link.recovery or 0) + (link.crc or 0) > 0]
    if noisy:
        i, n, rep, rec, crc = max(noisy, key=lambda t: t[2] + t[3] + t[4])
        total = sum(t[2] + t[3] + t[4] for t in noisy)
        checks.append(Check("errors", Status.WARN, f"{len(noisy)} link(s) with errors; worst GPU {i} link {n}: "
                            f"replay {rep}, recovery {rec}, crc {crc}", total, 0, "errors",
                            "watch for growth (nvidia-smi nvlink -e); a rising count precedes NCCL hangs"))
    elif any(link.replay is not None for g in gpus for link in g.nvlinks):
        checks.append(Check("errors", Status.PASS, "no replay, recovery or CRC errors", 0, 0, "errors"))
    if ctx.deep:
        checks.append(_p2p(ctx))
    return checks


def _p2p(ctx: Context) -> Check:
    try:
        pairs = deep.peer_to_peer(ctx.cancel)
    except deep.Unavailable as err:
        return Check("p2p", Status.SKIP, str(err))
    if not pairs:
        return Check("p2p", Status.SKIP, "one GPU: no GPU-to-GPU copy to measure")
    bad = [p for p in pairs if p.error]
    if bad:
        return Check("p2p", Status.FAIL, f"GPU {bad[0].src} -> {bad[0].dst}: {bad[0].error}", None, None, "GB/s",
                     "check peer access (nvidia-smi topo -m) and the NVLink fabric")
    median = statistics.median(p.gbps for p in pairs)
    per = ", ".join(f"{p.src}->{p.dst}:{p.gbps:.0f}" for p in pairs)
    slow = [p for p in pairs if p.gbps < 0.8 * median]
    if slow:
        return Check("p2p", Status.WARN, f"GPU {slow[0].src} -> {slow[0].dst} at {slow[0].gbps:.0f} GB/s, median "
                     f"{median:.0f} ({per})", round(min(p.gbps for p in pairs), 1), f">= {0.8 * median:.0f}", "GB/s",
                     "a slow pair throttles every ring collective: check its links")
    return Check("p2p", Status.PASS, per + " GB/s", round(min(p.gbps for p in pairs), 1), None, "GB/s")
