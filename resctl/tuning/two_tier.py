"""Two-tier plan: how often to snapshot into host memory and how often to write to disk.

With the memory tier (`checkpoint.memory_every`) the two intervals answer to different faults:

- A **process fault** (an exception, a SIGKILL, a hang, a GPU error that a restart clears) keeps
  the node and its shared memory: the job resumes from the newest memory snapshot. Its interval
  comes from Daly's optimum on the *memory* blocking cost `s_m` (the copy out of the state) against
  the MTBF of such faults, and never below `headroom * commit_m` of compute: the next snapshot
  must not wait for the previous one's background checksum and manifest.
- A **node fault** (the host is lost, or its memory with it) falls back to disk. The disk interval
  comes from the single-tier model (`model.recommend`) on the disk costs against the MTBF of node
  faults alone, which is why it can be much longer than without the memory tier. It is rounded up
  to a multiple of the memory interval, so every disk write reads a memory snapshot (one copy out
  of the state serves both tiers).

Pure math, no I/O; the inputs come from the same calibration as `tune-interval` (`ckpt_mem`
events give `s_m` and `commit_m`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from resctl.tuning.model import DEFAULT_HEADROOM, Costs, daly_interval, recommend


@dataclass(frozen=True)
class TwoTierPlan:
    memory_every: int  # steps between memory snapshots
    interval_steps: int  # steps between disk checkpoints (a multiple of memory_every)
    memory_rule: str  # "daly" or "commit" (the commit-time floor decided)
    memory_efficiency: float  # tau_m / (tau_m + s_m): what the snapshots leave of a fault-free run
    expected_loss_process_s: float  # compute lost to one process fault: half a memory interval
    expected_loss_node_s: float  # compute lost to one node fault: half a disk interval (plus the write)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def plan(*, step_time: float, mem_stall: float, mem_commit: float, disk: Costs, process_mtbf: float,
         node_mtbf: float, headroom: float = DEFAULT_HEADROOM) -> TwoTierPlan:
    """The two intervals (see the module docstring). `disk.mtbf` is replaced by `node_mtbf`."""
    if step_time <= 0 or mem_stall < 0 or mem_commit < 0 or process_mtbf <= 0 or node_mtbf <= 0:
        raise ValueError("step_time, process_mtbf and node_mtbf must be > 0; mem_stall and mem_commit >= 0")
    tau = daly_interval(max(mem_stall, 1e-9), process_mtbf)
    floor = headroom * mem_commit
    rule = "daly" if tau >= floor else "commit"
    tau = max(tau, floor, step_time)
    memory_every = max(1, math.ceil(tau / step_time)) if math.isfinite(tau) else 1
    disk_rec = recommend(replace(disk, mtbf=node_mtbf))
    interval = max(memory_every, math.ceil(disk_rec.interval_steps / memory_every) * memory_every)
    tau_m = memory_every * step_time
    return TwoTierPlan(
        memory_every=memory_every, interval_steps=interval, memory_rule=rule,
        memory_efficiency=round(tau_m / (tau_m + mem_stall), 6),
        expected_loss_process_s=round(tau_m / 2, 6),
        expected_loss_node_s=round(interval * step_time / 2 + disk.stall + disk.write, 6),
    )
