"""Clock probe: is the wall clock plausible and synchronised, and is the clock source cheap?
Events of different nodes are compared by wall time (goodput, restart timelines), and TLS to
storage and registries fails on a clock far off.

Verdicts:
  wall         FAIL a wall clock before 2024 (an RTC reset).
  sync         WARN the kernel says the clock is unsynchronised (adjtimex TIME_ERROR); SKIP on
               a snapshot root or where adjtimex is not allowed.
  clocksource  WARN xen/hpet/acpi_pm: every time read is a slow syscall (AWS recommends tsc).
"""

from __future__ import annotations

import ctypes
import time

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Status
from resctl.launch.lifeline import libc

TIME_ERROR = 5
STA_UNSYNC = 0x0040
SLOW_SOURCES = {"xen", "hpet", "acpi_pm", "jiffies"}


class _Timex(ctypes.Structure):
    # struct timex from <sys/timex.h> (Linux, 64-bit): the fields read here come first
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long), ("tolerance", ctypes.c_long),
                ("time_sec", ctypes.c_long), ("time_usec", ctypes.c_long), ("tick", ctypes.c_long),
                ("ppsfreq", ctypes.c_long), ("jitter", ctypes.c_long), ("shift", ctypes.c_int),
                ("stabil", ctypes.c_long), ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long),
                ("errcnt", ctypes.c_long), ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int),
                ("_pad", ctypes.c_int * 11)]


def adjtimex() -> tuple[int, int, int]:
    """(state, status bits, max error in microseconds) from a read-only adjtimex(2)."""
    tx = _Timex()
    state = libc().adjtimex(ctypes.byref(tx))
    if state < 0:
        raise OSError(ctypes.get_errno(), "adjtimex failed")
    return state, tx.status, tx.maxerror


def run(ctx: Context) -> list[Check]:
    checks = []
    now = time.time()
    year = time.gmtime(now).tm_year
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    if year < 2024:
        checks.append(Check("wall", Status.FAIL, f"wall clock reads {stamp}", stamp, ">= 2024", "",
                            "set the clock (chrony / systemd-timesyncd); check the RTC battery"))
    else:
        checks.append(Check("wall", Status.PASS, stamp, stamp))
    if ctx.live:
        try:
            state, status, maxerror = adjtimex()
            if state == TIME_ERROR or status & STA_UNSYNC:
                checks.append(Check("sync", Status.WARN, f"kernel clock unsynchronised (max error {maxerror / 1e3:.0f} "
                                    "ms)", "unsynchronised", "synchronised", "",
                                    "run chrony (on AWS: the Time Sync Service at 169.254.169.123)"))
            else:
                checks.append(Check("sync", Status.PASS, f"synchronised (max error {maxerror / 1e3:.1f} ms)",
                                    round(maxerror / 1e3, 1), None, "ms"))
        except (OSError, AttributeError) as err:
            checks.append(Check("sync", Status.SKIP, f"adjtimex unavailable: {err}"))
    else:
        checks.append(Check("sync", Status.SKIP, "not measured on a snapshot root"))
    source = ctx.read("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    if source is not None:
        source = source.strip()
        if source in SLOW_SOURCES:
            checks.append(Check("clocksource", Status.WARN, f"clock source {source}: time reads are syscalls", source,
                                "tsc", "", "boot with clocksource=tsc tsc=reliable (AWS guidance for Nitro)"))
        else:
            checks.append(Check("clocksource", Status.PASS, source, source))
    return checks
