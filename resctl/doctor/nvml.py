"""A thin adapter over NVML (nvidia-ml-py's `pynvml`), so probes can be tested without GPUs.

Probes ask an `Nvml` for plain dataclasses; `PynvmlAdapter` fills them from the driver,
`SnapshotNvml` from a JSON file (the fixture nodes under tests/fixtures/nodes, or a snapshot
taken on a real node with ``python -m resctl.doctor.nvml > nvml.json``). A field the driver
does not support on this GPU is None, never an exception.
"""

from __future__ import annotations

import json
import sys
import threading
import warnings
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no library, no driver); `str(err)` says why."""


@dataclass(frozen=True)
class DriverInfo:
    version: str  # "580.159.03"
    cuda: int | None  # highest CUDA the driver supports, as NVML encodes it: 13000 = 13.0


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool
    replay: int | None = None  # data-link replay errors since boot/reset
    recovery: int | None = None  # link recoveries
    crc: int | None = None  # CRC flit errors


@dataclass(frozen=True)
class Gpu:
    """What the probes need of one GPU. Sizes in bytes."""

    index: int
    name: str
    uuid: str = ""
    pci_bus_id: str = ""
    memory_total: int | None = None
    memory_used: int | None = None
    processes: int | None = None  # compute processes holding the GPU
    ecc_enabled: bool | None = None
    ecc_uncorrectable_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    temperature_c: int | None = None
    slowdown_temp_c: int | None = None
    clock_events: tuple[str, ...] = ()  # active clock-event (throttle) reasons, see CLOCK_EVENTS
    persistence: bool | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    nvlinks: tuple[NvLink, ...] = field(default=())


#: NVML clock-event reason bits we name (nvmlClocksEventReason*).
CLOCK_EVENTS = {
    0x1: "gpu_idle", 0x2: "applications_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}


class Nvml(Protocol):
    """What probes call. Implementations must be safe to call from several threads."""

    def driver(self) -> DriverInfo: ...

    def gpus(self) -> list[Gpu]: ...


def _opt(call: Callable[[], T]) -> T | None:
    """The value, or None when this GPU/driver does not support the query."""
    try:
        return call()
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses; a missing symbol raises others
        return None


class PynvmlAdapter:
    """NVML through nvidia-ml-py. `nvmlInit` runs once, in the constructor.

    Raises:
        NvmlUnavailable: no pynvml module, no libnvidia-ml, or no driver loaded.
    """

    def __init__(self) -> None:
        try:
            with warnings.catch_warnings():
                # the `pynvml` shim distribution warns on import; nvidia-ml-py provides the same module
                warnings.simplefilter("ignore")
                import pynvml  # type: ignore[import-untyped]
        except ImportError as err:
            raise NvmlUnavailable(f"nvidia-ml-py is not installed ({err})") from err
        self._nv: Any = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            raise NvmlUnavailable(f"NVML did not initialise: {err}") from err
        self._lock = threading.Lock()
        self._gpus: list[Gpu] | None = None

    def driver(self) -> DriverInfo:
        nv = self._nv
        version = nv.nvmlSystemGetDriverVersion()
        return DriverInfo(version.decode() if isinstance(version, bytes) else str(version),
                          _opt(nv.nvmlSystemGetCudaDriverVersion))

    def gpus(self) -> list[Gpu]:
        # gpu and nvlink probes run at the same time: query the devices once
        with self._lock:
            if self._gpus is None:
                self._gpus = [self._gpu(i) for i in range(self._nv.nvmlDeviceGetCount())]
            return self._gpus

    def _gpu(self, index: int) -> Gpu:
        nv = self._nv
        h = nv.nvmlDeviceGetHandleByIndex(index)
        mem = _opt(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        ecc = _opt(lambda: nv.nvmlDeviceGetEccMode(h))
        remap = _opt(lambda: nv.nvmlDeviceGetRemappedRows(h))  # (corrected, uncorrected, pending, failure)
        reasons = _opt(lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None:
            reasons = _opt(lambda: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        procs = _opt(lambda: nv.nvmlDeviceGetComputeRunningProcesses(h))
        pending = _opt(lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
        persistence = _opt(lambda: nv.nvmlDeviceGetPersistenceMode(h))
        return Gpu(
            index=index,
            name=_str(nv.nvmlDeviceGetName(h)),
            uuid=_str(_opt(lambda: nv.nvmlDeviceGetUUID(h)) or ""),
            pci_bus_id=_str(_opt(lambda: nv.nvmlDeviceGetPciInfo(h).busId) or ""),
            memory_total=int(mem.total) if mem is not None else None,
            memory_used=int(mem.used) if mem is not None else None,
            processes=len(procs) if procs is not None else None,
            ecc_enabled=bool(ecc[0]) if ecc is not None else None,
            ecc_uncorrectable_volatile=_opt(lambda: int(nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))),
            retired_pages_pending=bool(pending) if pending is not None else None,
            remap_pending=bool(remap[2]) if remap is not None else None,
            remap_failure=bool(remap[3]) if remap is not None else None,
            temperature_c=_opt(lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            slowdown_temp_c=_opt(lambda: int(nv.nvmlDeviceGetTemperatureThreshold(
                h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))),
            clock_events=tuple(name for bit, name in CLOCK_EVENTS.items() if reasons and reasons & bit),
            persistence=bool(persistence) if persistence is not None else None,
            pcie_width=_opt(lambda: int(nv.nvmlDeviceGetCurrPcieLinkWidth(h))),
            pcie_width_max=_opt(lambda: int(nv.nvmlDeviceGetMaxPcieLinkWidth(h))),
            nvlinks=tuple(self._links(h)),
        )

    def _links(self, h: Any) -> list[NvLink]:
        nv = self._nv
        out = []
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            state = _opt(partial(nv.nvmlDeviceGetNvLinkState, h, link))
            if state is None:  # the link does not exist on this GPU (or NVLink is unsupported)
                continue
            counts = [_opt(partial(_int_of, nv.nvmlDeviceGetNvLinkErrorCounter, h, link, kind))
                      for kind in (nv.NVML_NVLINK_ERROR_DL_REPLAY, nv.NVML_NVLINK_ERROR_DL_RECOVERY,
                                   nv.NVML_NVLINK_ERROR_DL_CRC_FLIT)]
            out.append(NvLink(link, bool(state), *counts))
        return out


def _int_of(query: Callable[..., Any], *args: Any) -> int:
    return int(query(*args))


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class SnapshotNvml:
    """NVML answers read from a JSON snapshot: ``{"driver": {...}, "gpus": [{...,"nvlinks": [...]}]}``.

    The keys are the field names of `DriverInfo`, `Gpu` and `NvLink`; missing keys take the
    dataclass defaults. Used by the fixture nodes and by ``resctl doctor --root SNAPSHOT``.
    """

    def __init__(self, path: Path) -> None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError as err:
            raise NvmlUnavailable(f"no NVML snapshot at {path}") from err
        except (OSError, ValueError) as err:
            raise NvmlUnavailable(f"unreadable NVML snapshot {path}: {err}") from err
        if data.get("unavailable"):
            raise NvmlUnavailable(str(data["unavailable"]))
        self._driver = DriverInfo(**data["driver"])
        known = {f.name for f in fields(Gpu)}
        self._gpus = []
        for raw in data.get("gpus", []):
            raw = {k: v for k, v in raw.items() if k in known}
            raw["nvlinks"] = tuple(NvLink(**link) for link in raw.get("nvlinks", []))
            raw["clock_events"] = tuple(raw.get("clock_events", ()))
            self._gpus.append(Gpu(**raw))

    def driver(self) -> DriverInfo:
        return self._driver

    def gpus(self) -> list[Gpu]:
        return list(self._gpus)


def snapshot(nvml: Nvml) -> dict[str, Any]:
    """The JSON document `SnapshotNvml` reads, taken from any adapter."""
    return {"driver": asdict(nvml.driver()), "gpus": [asdict(g) for g in nvml.gpus()]}


if __name__ == "__main__":
    # `python -m resctl.doctor.nvml > nvml.json`: record this node for a fixture or a bug report
    try:
        json.dump(snapshot(PynvmlAdapter()), sys.stdout, indent=1)
        sys.stdout.write("\n")
    except NvmlUnavailable as err:
        print(f"NVML unavailable: {err}", file=sys.stderr)
        sys.exit(1)
