"""memlock probe: the locked-memory limit (`ulimit -l`) of this process, which the workers
inherit. RDMA (EFA/InfiniBand) registers, i.e. locks, every buffer it sends from; a limited
memlock makes NCCL's network plugin fail at the first collective.

Verdicts:
  limit  PASS unlimited; FAIL limited on a node with (or expected to have) EFA/IB devices;
         PASS with the limit otherwise (only RDMA needs it raised).
"""

from __future__ import annotations

import resource

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Skip, Status

FIX = ("raise it: `ulimit -l unlimited` before resctl, Docker --ulimit memlock=-1, or containerd's LimitMEMLOCK="
       "infinity on the node")


def _limits(ctx: Context) -> tuple[float, float]:
    """(soft, hard) in bytes; inf for unlimited. Read from <root>/proc/self/limits."""
    text = ctx.read("/proc/self/limits")
    if text is None:
        if not ctx.live:
            raise Skip("no proc/self/limits in the snapshot")
        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        conv = lambda v: float("inf") if v == resource.RLIM_INFINITY else float(v)  # noqa: E731
        return conv(soft), conv(hard)
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            words = line[len("Max locked memory"):].split()[:2]
            conv2 = lambda v: float("inf") if v == "unlimited" else float(v)  # noqa: E731
            return conv2(words[0]), conv2(words[1])
    raise Skip("no 'Max locked memory' line in /proc/self/limits")


def run(ctx: Context) -> list[Check]:
    soft, hard = _limits(ctx)
    show = lambda v: "unlimited" if v == float("inf") else f"{v / (1 << 20):g} MiB"  # noqa: E731
    if soft == float("inf"):
        return [Check("limit", Status.PASS, "unlimited", "unlimited", "unlimited")]
    rdma = ctx.path("/sys/class/infiniband").is_dir() and any(ctx.path("/sys/class/infiniband").iterdir())
    hint = FIX + (" (the hard limit allows it: `ulimit -l unlimited` suffices)" if hard == float("inf") else "")
    if rdma or ctx.expect.efa_devices:
        return [Check("limit", Status.FAIL, f"{show(soft)} (hard {show(hard)}) on an RDMA node", show(soft),
                      "unlimited", "", hint)]
    return [Check("limit", Status.PASS, f"{show(soft)} (hard {show(hard)}); only RDMA needs it unlimited",
                  show(soft), "unlimited with EFA/IB")]
