"""Hardware counters of this process through perf_event_open(2) (ctypes, no perf binary): cycles, instructions,
cache and TLB misses, so a bench can say whether a slower loop runs more instructions or the same ones slower
(issue 43: a forked worker's step +15 % in every phase). Counters opened before a thread starts count it too
(`inherit`); reading one gives this thread's count plus its live and exited children's. Where the kernel or a
container refuses them (perf_event_paranoid, seccomp), `Counters.error` says why and `read()` returns {}.

    c = Counters(); before = c.read(); loop(); delta = Counters.diff(before, c.read())
"""

from __future__ import annotations

import ctypes
import os

_SYS_PERF_EVENT_OPEN = 298  # x86_64
_HW, _SW, _CACHE = 0, 1, 3
_DTLB, _ITLB, _LL = 3, 4, 2
_MISS = 1 << 16  # (op read = 0) << 8 | result miss << 16
EVENTS = {
    "cycles": (_HW, 0), "instructions": (_HW, 1), "cache_misses": (_HW, 3), "branch_misses": (_HW, 5),
    "dtlb_misses": (_CACHE, _DTLB | _MISS), "itlb_misses": (_CACHE, _ITLB | _MISS), "ll_misses": (_CACHE, _LL | _MISS),
    "task_clock_ns": (_SW, 1), "page_faults": (_SW, 2), "migrations": (_SW, 4),
}


class _Attr(ctypes.Structure):
    _fields_ = [("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
                ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64), ("read_format", ctypes.c_uint64),
                ("flags", ctypes.c_uint64), ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
                ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64), ("branch_sample_type", ctypes.c_uint64),
                ("sample_regs_user", ctypes.c_uint64), ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
                ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
                ("sample_max_stack", ctypes.c_uint16), ("reserved2", ctypes.c_uint16), ("aux_sample_size", ctypes.c_uint32),
                ("reserved3", ctypes.c_uint32), ("sig_data", ctypes.c_uint64), ("config3", ctypes.c_uint64)]


_INHERIT, _EXCLUDE_KERNEL, _EXCLUDE_HV = 1 << 1, 1 << 5, 1 << 6


class Counters:
    def __init__(self, names: tuple[str, ...] = tuple(EVENTS)) -> None:
        self.fds: dict[str, int] = {}
        self.error = ""
        libc = ctypes.CDLL(None, use_errno=True)
        for name in names:
            kind, config = EVENTS[name]
            for flags in (_INHERIT, _INHERIT | _EXCLUDE_KERNEL | _EXCLUDE_HV):  # user+kernel, else user only
                attr = _Attr(type=kind, size=ctypes.sizeof(_Attr), config=config, flags=flags)
                fd = libc.syscall(_SYS_PERF_EVENT_OPEN, ctypes.byref(attr), 0, -1, -1, 0)
                if fd >= 0:
                    self.fds[name] = fd
                    break
            else:
                self.error += f"{name}: {os.strerror(ctypes.get_errno())}; "

    def read(self) -> dict[str, int]:
        return {n: int.from_bytes(os.read(fd, 8), "little") for n, fd in self.fds.items()}

    @staticmethod
    def diff(before: dict[str, int], after: dict[str, int], per: int = 1) -> dict[str, float]:
        d = {k: (after[k] - before[k]) / per for k in after if k in before}
        if d.get("cycles") and "instructions" in d:
            d["ipc"] = d["instructions"] / d["cycles"]
        return {k: round(v, 3) for k, v in d.items()}


def thread_names() -> dict[str, int]:
    """This process's OS threads by name (/proc/self/task/*/comm), counted: what a counter's `inherit` covers, and
    which threads a forked worker lacks beside a fresh one."""
    names: dict[str, int] = {}
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items()))
