"""What a probe returns: checks with a status, the measured and expected values, and a fix.

A probe (one module of `resctl.doctor`) returns a list of `Check`; the runner wraps them in a
`ProbeResult` with the time the probe took, and the results of a whole run in a `Report`, which
knows the exit code and renders the JSON document described in docs/doctor.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from resctl import __version__

#: A JSON scalar: what `measured` and `expected` may hold.
Value = int | float | str | bool | None

SCHEMA = "resctl.doctor/1"


class Status(str, Enum):
    """A check's verdict. Order of severity: SKIP < PASS < WARN < FAIL."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.SKIP: 0, Status.PASS: 1, Status.WARN: 2, Status.FAIL: 3}


class Skip(Exception):
    """Raised by a probe that cannot run here; `str(err)` says why (the runner turns it into SKIP)."""


@dataclass(frozen=True)
class Check:
    """One verdict of a probe.

    Attributes:
        name: short id, unique within the probe ("count", "ecc", "write").
        status: the verdict.
        message: one line a person reads: what was found, naming the GPU/device/path at fault.
        measured: what was measured (a number in `unit`, or a short string); None when nothing was.
        expected: what the node should show (a number, or a string such as ">= 18"); None when
            nothing is expected.
        unit: unit of `measured` and `expected` ("GB/s", "GiB", "links"), or "".
        fix: what to do about a WARN or FAIL; "" for PASS and SKIP.
    """

    name: str
    status: Status
    message: str
    measured: Value = None
    expected: Value = None
    unit: str = ""
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "measured": self.measured,
                "expected": self.expected, "unit": self.unit, "message": self.message, "fix": self.fix}


def worst(statuses: list[Status]) -> Status:
    """The most severe status; SKIP for an empty list."""
    return max(statuses, key=lambda s: s.severity, default=Status.SKIP)


@dataclass
class ProbeResult:
    """The checks of one probe and how long it ran."""

    probe: str
    checks: list[Check]
    duration_s: float
    timed_out: bool = False

    @property
    def status(self) -> Status:
        return worst([c.status for c in self.checks])

    def to_json(self) -> dict[str, Any]:
        return {"name": self.probe, "status": self.status.value, "duration_s": round(self.duration_s, 3),
                "timed_out": self.timed_out, "checks": [c.to_json() for c in self.checks]}


@dataclass
class Report:
    """The result of one `resctl doctor` run."""

    probes: list[ProbeResult]
    duration_s: float
    host: str
    root: str
    started: str
    deep: bool
    expectations: dict[str, Any] = field(default_factory=dict)

    def status(self) -> Status:
        return worst([p.status for p in self.probes])

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing failed; 1 on any FAIL, or on any WARN when `strict`."""
        bad = {Status.FAIL, Status.WARN} if strict else {Status.FAIL}
        return 1 if any(c.status in bad for p in self.probes for c in p.checks) else 0

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in Status}
        for p in self.probes:
            for c in p.checks:
                out[c.status.value] += 1
        return out

    def to_json(self, strict: bool = False) -> dict[str, Any]:
        """The `--json` document (schema "resctl.doctor/1", documented in docs/doctor.md)."""
        return {
            "schema": SCHEMA,
            "resctl_version": __version__,
            "host": self.host,
            "root": self.root,
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
            "deep": self.deep,
            "strict": strict,
            "status": self.status().value,
            "exit_code": self.exit_code(strict),
            "counts": self.counts(),
            "expectations": self.expectations,
            "probes": [p.to_json() for p in self.probes],
        }


def gb(n: float) -> float:
    """Bytes as decimal GB (the unit of the profile's *_gb keys), rounded for display."""
    return round(n / 1e9, 2)
