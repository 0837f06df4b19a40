"""What a node should have: the profile's `[doctor]` section over per-instance-type defaults.

Precedence for each key: the profile (file, RESCTL_DOCTOR_* env, --set) > the defaults of the
instance type (`doctor.instance_type`, else the node's DMI product name, which on AWS Nitro
instances is the instance type) > nothing expected (the probe reports what it measured).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from resctl.profile.schema import Profile

#: Hardware of the instance types we know; numbers from the AWS instance-type pages.
KNOWN: dict[str, dict[str, Any]] = {
    "p5.48xlarge": {"gpus": 8, "gpu_model": "H100", "nvlinks_per_gpu": 18, "efa_devices": 32},
    "p5e.48xlarge": {"gpus": 8, "gpu_model": "H200", "nvlinks_per_gpu": 18, "efa_devices": 32},
    "p5en.48xlarge": {"gpus": 8, "gpu_model": "H200", "nvlinks_per_gpu": 18, "efa_devices": 16},
    "p4d.24xlarge": {"gpus": 8, "gpu_model": "A100", "nvlinks_per_gpu": 12, "efa_devices": 4},
    "p4de.24xlarge": {"gpus": 8, "gpu_model": "A100", "nvlinks_per_gpu": 12, "efa_devices": 4},
}

_HARDWARE = ("gpus", "gpu_model", "nvlinks_per_gpu", "efa_devices")
DMI_PRODUCT = "sys/devices/virtual/dmi/id/product_name"


@dataclass(frozen=True)
class Expectations:
    """Resolved expectations; None (or "") means nothing is expected and the probe only reports.

    `sources` says where each hardware key came from: "profile", "<type> defaults" or "none".
    """

    instance_type: str
    instance_source: str
    gpus: int | None
    gpu_model: str
    nvlinks_per_gpu: int | None
    efa_devices: int | None
    min_storage_gbps: float | None
    checkpoint_size_gb: float | None
    checkpoint_every_s: float | None
    keep_last: int
    writers: int
    min_shm_gb: float
    storage_test_mb: int
    timeout_s: float
    multi_node: bool
    inprocess: bool
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def needed_storage_gbps(self) -> float | None:
        """The write throughput the checkpoints need: the profile's minimum, or size / interval."""
        rates = [r for r in (self.min_storage_gbps,) if r is not None]
        if self.checkpoint_size_gb and self.checkpoint_every_s:
            rates.append(self.checkpoint_size_gb / self.checkpoint_every_s)
        return max(rates) if rates else None

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["needed_storage_gbps"] = self.needed_storage_gbps
        return out


def detect_instance_type(root: Path) -> str:
    """The DMI product name under `root` (e.g. "p5.48xlarge" on AWS), or ""."""
    try:
        return (root / DMI_PRODUCT).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def resolve(profile: Profile, root: Path, explicit: frozenset[str] = frozenset()) -> Expectations:
    """Merge the profile's doctor section with the instance type's defaults.

    Args:
        profile: the resolved profile.
        root: filesystem root to read the DMI product name from.
        explicit: dotted keys the user set (a profile value that equals the schema default but was
            typed, e.g. ``gpu_model = ""``, still beats the instance defaults).
    """
    doc = profile.doctor
    if doc.instance_type:
        itype, isource = doc.instance_type, "profile"
    else:
        itype = detect_instance_type(root)
        isource = "dmi product_name" if itype else "none"
    defaults = KNOWN.get(itype, {})
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for key in _HARDWARE:
        mine = getattr(doc, key)
        if (mine not in (None, "")) or f"doctor.{key}" in explicit:
            values[key], sources[key] = mine, "profile"
        elif key in defaults:
            values[key], sources[key] = defaults[key], f"{itype} defaults"
        else:
            values[key], sources[key] = mine, "none"
    nnodes = profile.launch.nnodes.split(":")[-1]
    return Expectations(
        instance_type=itype,
        instance_source=isource + ("" if not itype or itype in KNOWN else " (unknown type: no defaults)"),
        gpus=values["gpus"],
        gpu_model=values["gpu_model"] or "",
        nvlinks_per_gpu=values["nvlinks_per_gpu"],
        efa_devices=values["efa_devices"],
        min_storage_gbps=doc.min_storage_gbps,
        checkpoint_size_gb=doc.checkpoint_size_gb,
        checkpoint_every_s=doc.checkpoint_every,
        keep_last=profile.checkpoint.keep_last,
        writers=profile.checkpoint.writers,
        min_shm_gb=doc.min_shm_gb,
        storage_test_mb=doc.storage_test_mb,
        timeout_s=doc.timeout,
        multi_node=not nnodes.isdigit() or int(nnodes) > 1,
        inprocess=profile.inprocess.enabled,
        sources=sources,
    )
