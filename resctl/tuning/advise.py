"""What `resctl tune-interval` recommends, as data: `advise()` assembles the model's inputs (flags
over a run's calibration), plans the disk tier and, when the memory tier can be planned, both tiers,
and assesses the job's current two-tier settings. The CLI parses flags into `Inputs` and
`MemoryInputs`, calls it, and renders the `Advice`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from resctl.telemetry.calibration import Calibration
from resctl.tuning.inputs import Assembled, Inputs, MemoryAssembled, MemoryInputs, assemble, assemble_memory
from resctl.tuning.model import Recommendation, recommend
from resctl.tuning.two_tier import TwoTierPlan, assess, plan


@dataclass(frozen=True)
class Advice:
    """The disk tier's recommendation and, with memory-tier numbers, the two-tier plan."""

    recommendation: Recommendation
    assembled: Assembled  # the disk tier's inputs and where each came from
    two_tier: TwoTierPlan | None = None
    memory: MemoryAssembled | None = None  # the memory tier's inputs (with `two_tier`)
    skipped: str | None = None  # why the memory tier is not planned
    #: the job's current (memory_every, interval_steps) assessed like the plan; a sentence when it
    #: cannot be (not a multiple); None without both numbers or without a plan
    current: TwoTierPlan | str | None = None

    @property
    def values(self) -> dict[str, int]:
        """The `[checkpoint]` keys to set."""
        if self.two_tier is None:
            return {"interval_steps": self.recommendation.interval_steps}
        return {"interval_steps": self.two_tier.interval_steps, "memory_every": self.two_tier.memory_every}

    @property
    def sources(self) -> dict[str, str]:
        return {**self.assembled.sources, **(self.memory.sources if self.memory else {})}

    @property
    def warnings(self) -> list[str]:
        return self.recommendation.warnings + (self.two_tier.warnings if self.two_tier else [])

    def to_json(self) -> dict[str, Any]:
        now = self.current
        return {"recommendation": self.recommendation.to_json(),
                "two_tier": self.two_tier.to_json() if self.two_tier else None,
                "two_tier_current": now if isinstance(now, str) or now is None else now.to_json(),
                "two_tier_skipped": self.skipped, "mtbf_assumption": self.memory.assumption if self.memory else None,
                "profile": self.values, "sources": self.sources}


def advise(given: Inputs, given_mem: MemoryInputs, calibration: Calibration | None, budget: float) -> Advice:
    """The advice for a job (`budget`: the two tiers' fault-free overhead allowed, a fraction).
    Raises `MissingInput` for an input neither given nor measured, `ValueError` for a job the model
    cannot take."""
    assembled = assemble(given, calibration)
    rec = recommend(assembled.costs, assembled.current, assembled.mode)
    mem = assemble_memory(given_mem, calibration, assembled, given.nodes)
    if isinstance(mem, str):
        return Advice(rec, assembled, skipped=mem)
    two = plan(mem.memory, assembled.costs, process_mtbf=mem.process_mtbf, node_mtbf=mem.node_mtbf,
               mode=assembled.mode, max_overhead=budget)
    return Advice(rec, assembled, two, mem, current=_current(mem, rec, assembled, budget))


def _current(mem: MemoryAssembled, rec: Recommendation, assembled: Assembled, budget: float) -> TwoTierPlan | str | None:
    if mem.current is None or rec.current is None:
        return None
    m, n = mem.current, rec.current.interval_steps
    if n < m or n % m:
        return (f"interval_steps {n} is not a multiple of memory_every {m}: disk saves at other steps copy the "
                "state again (not modelled)")
    return assess(m, n, mem.memory, replace(assembled.costs, mtbf=mem.node_mtbf), process_mtbf=mem.process_mtbf,
                  mode=assembled.mode, max_overhead=budget)
