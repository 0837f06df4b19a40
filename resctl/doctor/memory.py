"""Host memory probe: MemAvailable from /proc/meminfo against the checkpoint size, since an
async checkpoint first copies the whole per-node state into host memory.

Verdicts:
  available  FAIL less available than doctor.checkpoint_size_gb; WARN less than 1.5x (the
             dataloaders and page cache need room too). Without a size: WARN under 5 % of total.
"""

from __future__ import annotations

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Skip, Status, gb


def meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo as bytes per key."""
    out = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            out[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def run(ctx: Context) -> list[Check]:
    text = ctx.read("/proc/meminfo")
    if text is None:
        raise Skip("no /proc/meminfo")
    info = meminfo(text)
    if "MemAvailable" not in info:
        raise Skip("no MemAvailable in /proc/meminfo")
    avail, total = info["MemAvailable"], info.get("MemTotal", 0)
    a = gb(avail)
    size = ctx.expect.checkpoint_size_gb
    if size:
        if avail / 1e9 < size:
            return [Check("available", Status.FAIL, f"{a} GB available, a {size:g} GB checkpoint is staged in host "
                          "memory", a, size, "GB", "give the pod more memory (limits.memory) or shard the checkpoint "
                          "over more nodes")]
        if avail / 1e9 < 1.5 * size:
            return [Check("available", Status.WARN, f"{a} GB available for a {size:g} GB checkpoint: little headroom",
                          a, 1.5 * size, "GB", "raise the pod's memory limit")]
        return [Check("available", Status.PASS, f"{a} GB of {gb(total)} GB available", a, size, "GB")]
    if total and avail < 0.05 * total:
        return [Check("available", Status.WARN, f"{a} GB of {gb(total)} GB available (under 5 %)", a, None, "GB",
                      "find what holds the memory; set doctor.checkpoint_size_gb for an exact check")]
    return [Check("available", Status.PASS, f"{a} GB of {gb(total)} GB available", a, None, "GB")]
