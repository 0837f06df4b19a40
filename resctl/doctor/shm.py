"""/dev/shm probe. Containers get 64 MB by default; NCCL's shared-memory transport, dataloader
workers and NVRx's IPC all live there, and running out shows up as a bus error mid-training.

Verdicts:
  size   FAIL /dev/shm missing or smaller than doctor.min_shm_gb.
  free   WARN less free than doctor.min_shm_gb (something already fills it).
  memory_tier  (only with checkpoint.memory_every > 0) FAIL /dev/shm smaller than the memory tier
         needs: `slots.shm_factor` x doctor.checkpoint_size_gb (resctl.slots: the snapshot
         slots per rank, the restored state in shared pages after a restore and, with the buddy
         copies (checkpoint.memory_replicate and more than one node), another node's slots);
         WARN less free than that, or no doctor.checkpoint_size_gb to check against.
"""

from __future__ import annotations

from resctl import slots
from resctl.doctor.context import Context, Space
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
    if ctx.profile.checkpoint.memory_every:
        checks.append(memory_tier(ctx, space))
    return checks


def memory_tier(ctx: Context, space: Space) -> Check:
    size = ctx.expect.checkpoint_size_gb
    if not size:
        return Check("memory_tier", Status.WARN, "checkpoint.memory_every is on but the state size is unknown", None,
                     None, "GB", "set doctor.checkpoint_size_gb (the per-node state) to check /dev/shm against it")
    ck = ctx.profile.checkpoint
    buddy = ck.memory_replicate and ctx.profile.launch.node_range.max > 1
    factor = slots.shm_factor(buddy)
    need = factor * size
    total, free = space.total / 1e9, space.free / 1e9
    fix = (f"the memory tier needs {need:g} GB of /dev/shm ({factor}x the {size:g} GB state"
           + (", buddy copies included" if buddy else "") + f"): {FIX}, or set checkpoint.memory_every to 0")
    if total < need:
        return Check("memory_tier", Status.FAIL, f"/dev/shm is {gb(space.total)} GB, the memory tier needs {need:g} GB",
                     gb(space.total), need, "GB", fix)
    if free < need:
        return Check("memory_tier", Status.WARN, f"{gb(space.free)} GB free in /dev/shm, the memory tier needs {need:g} GB",
                     gb(space.free), need, "GB", "remove stale files from /dev/shm (e.g. resctl-* of ended jobs)")
    return Check("memory_tier", Status.PASS, f"{gb(space.free)} GB free for the memory tier's {need:g} GB",
                 gb(space.free), need, "GB")
