"""/dev/shm probe. Containers get 64 MB by default; NCCL's shared-memory transport, dataloader
workers and NVRx's IPC all live there, and running out shows up as a bus error mid-training.

Verdicts:
  size   FAIL /dev/shm missing or smaller than doctor.min_shm_gb.
  free   WARN less free than doctor.min_shm_gb (something already fills it).
"""

from __future__ import annotations

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Status, gb

FIX = ('mount a bigger /dev/shm: Kubernetes `emptyDir: {medium: Memory, sizeLimit: 64Gi}` at /dev/shm, '
       'docker --shm-size=64g')


def run(ctx: Context) -> list[Check]:
    want = ctx.expect.min_shm_gb
    try:
        space = ctx.space("/dev/shm")
    except OSError as err:
        return [Check("size", Status.FAIL, f"/dev/shm unavailable: {err}", None, want, "GB", FIX)]
    size, free = gb(space.total), gb(space.free)
    if space.total / 1e9 < want:
        return [Check("size", Status.FAIL, f"/dev/shm is {size} GB, {want:g} GB needed", size, want, "GB", FIX)]
    checks = [Check("size", Status.PASS, f"{size} GB", size, want, "GB")]
    if space.free / 1e9 < want:
        checks.append(Check("free", Status.WARN, f"only {free} GB of {size} GB free", free, want, "GB",
                            "remove stale files from /dev/shm (leftovers of killed workers)"))
    else:
        checks.append(Check("free", Status.PASS, f"{free} GB free", free, want, "GB"))
    return checks
