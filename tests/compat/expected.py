"""Known differences from torchrun that are not fixed yet: case -> launcher -> reason.

Each entry makes its test xfail(strict=True): when the difference is fixed the test XPASSes, which
fails the run until the entry is removed here. docs/compat.md is generated with these reasons.
Reasons marked "intended (README)" are differences resctl keeps on purpose, each a row of the README's
"Differences from torchrun" table; the test still xfails so that the day one goes away it is seen.
"""

from __future__ import annotations

_HANG_EXIT = "hang: a forked worker ending this way is gone but `resctl run` never returns"
_TRACE = "the worker's traceback is not on the console (launcher.log and the summary only)"
_HANG_SPAWN = ("hang: Pool workers started with spawn/forkserver cannot load the script's function (__main__ "
               "is not the script's in them) and Pool.map waits forever")
_PRELOAD = "intended (README): the shim imported torch, numpy, NVRx, psutil and resctl before the script started"
_PRELOAD_EXEC = ("intended (README): the shim imported resctl (and pydantic) before the script started; torch and its "
                 "hooks come when the script imports torch")
_TITLE = "intended (README): workers are titled `resctl-worker rank=R ...` (setproctitle), so /proc/self/comm differs"
_THREAD = "intended (README): the shim's `resctl-sigterm` thread is running when the script starts"
_FAULT = ("intended (README): faulthandler's dump also shows the shim's thread, and its list of extension modules "
          "the shim's imports")
_SIGTERM = "intended (README): the shim's SIGTERM handler and wakeup fd are installed when the script starts"
_ENV = ("intended (README): TORCHELASTIC_RUN_ID is the job's run id (the run dir's name) where torchrun's static "
        "default rendezvous gives 'none'")
# A reason that starts with "sometimes" is a difference seen in some runs only (a race): its test is
# xfail(strict=False), so a pass does not fail the run; remove the entry once the cause is fixed.
EXPECTED: dict[str, dict[str, str]] = {
    "faulthandler_segv": {"fork": _FAULT, "exec": _FAULT},
    "env_torchelastic": {"fork": _ENV, "exec": _ENV},
    "interpreter_state": {"fork": _PRELOAD, "exec": _PRELOAD_EXEC},
    "proc_identity": {"fork": _TITLE + "; a forked worker does not lead its own session (torchrun's workers do: "
                               "start_new_session), which also puts it in the caller's scheduler autogroup",
                      "exec": _TITLE},
    "threads_at_start": {"fork": _THREAD, "exec": _THREAD},
    "sig_dispositions": {"fork": _SIGTERM, "exec": _SIGTERM},
    "rng_unseeded": {"fork": "intended (README): str hashes are the same on every rank (a fork keeps the launcher's hash secret)"},
}
