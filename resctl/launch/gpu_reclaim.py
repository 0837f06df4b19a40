"""After a restart's stop, wait for the GPU memory the stopped workers held, relative to what the GPUs held before.

NVRx 0.6+ (`LocalElasticAgent._wait_for_gpu_memory_reclaim`, called by its `_stop_workers` on every restart) waits
until each local GPU's *used* memory is at most `gpu_memory_tolerance_mb` (512 MB), polling every 2 s, for up to
`gpu_memory_reclaim_timeout` (50 s). Used memory never falls that low on a card whose driver keeps more in use
while idle, or on a GPU another process also uses: on one H200 (NVRx 0.7.0, 2026-12-06) every kill -9 at step 100
cost **50.9 s** instead of ~1 s, the whole timeout. resctl's agent keeps the wait and its limits but measures from
the memory each GPU used before this launcher's first workers started (`baseline`): reclaimed when every GPU is
within the tolerance of its own baseline, looked at every `POLL` seconds (a restart waits for no 2 s poll).
Without a baseline (no NVML, no GPU) NVRx's own wait runs.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence

POLL = 0.05  # seconds between looks at the GPUs while waiting

Reader = Callable[[int], "float | None"]  # device index -> used MB (None: cannot tell)


def nvml_reader() -> Reader | None:
    """Used MB of a device through NVRx's own NVML helper; None where NVML is absent."""
    try:  # deferred: NVRx 0.4/0.5 have no shared_utils.memory (their agent has no GPU memory wait either)
        from nvidia_resiliency_ext.shared_utils.memory import GPUMemoryLogger
    except ImportError:
        return None
    logger = GPUMemoryLogger()

    def used_mb(device: int) -> float | None:
        info = logger.get_gpu_memory(device_index=device)
        return None if info is None else float(info["used_mb"])

    return used_mb if used_mb(0) is not None else None


def baseline(read: Reader | None, devices: int) -> list[float] | None:
    """Each device's used MB now (before any worker); None when any cannot be read."""
    if read is None or devices < 1:
        return None
    used = [read(d) for d in range(devices)]
    return None if any(u is None for u in used) else [float(u) for u in used if u is not None]


def reclaimed(used: Sequence[float | None], base: Sequence[float], tolerance_mb: float) -> bool:
    """Every device within `tolerance_mb` of its baseline (a device that cannot be read counts as reclaimed, as in
    NVRx's own wait)."""
    return all(u is None or u - b <= tolerance_mb for u, b in zip(used, base))


def wait(read: Reader, base: Sequence[float], tolerance_mb: float, timeout: float,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> float | None:
    """Wait until `reclaimed`, at most `timeout` seconds; returns the seconds waited, None on the timeout."""
    start = clock()
    while True:
        if reclaimed([read(d) for d in range(len(base))], base, tolerance_mb):
            return clock() - start
        if clock() - start >= timeout:
            return None
        sleep(POLL)
