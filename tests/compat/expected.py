"""Known differences from torchrun that are not fixed yet: case -> launcher -> reason.

Each entry makes its test xfail(strict=True): when the difference is fixed the test XPASSes, which
fails the run until the entry is removed here. docs/compat.md is generated with these reasons.
Reasons marked "intended?" are differences resctl may keep on purpose; if so they belong in the
README's list of intended differences rather than here.
"""

from __future__ import annotations

_HANG_EXIT = "hang: a forked worker ending this way is gone but `resctl run` never returns"
_TRACE = "the worker's traceback is not on the console (launcher.log and the summary only)"
_HANG_SPAWN = "hang: spawned/forkserver children cannot load the script's functions (__main__ is not the script's)"
_RUN_PATH = ("intended?: the script runs through runpy.run_path, so __builtins__ is a dict, __loader__ None "
             "and __package__ '' where `python script.py` gives the module, SourceFileLoader and None")
_PRELOAD = "intended?: the shim imported torch, numpy, NVRx, psutil and resctl before the script started"
_TITLE = "intended?: workers are titled `resctl-worker rank=R ...` (setproctitle), so /proc/self/comm differs"
_THREAD = "the shim's `resctl-sigterm` thread is running when the script starts"
_POOL_SIGTERM = ("fork Pool children inherit the shim's SIGTERM handler and wakeup fd (resctl/shim/signals.py): "
                 "Pool.terminate() SIGTERMs them, the write lands in the parent's pipe and the parent worker "
                 "stops itself as for a job stop (exit 143)")
_STOP_CODE = "a job stopped by a signal whose workers end with 0 exits 0 where torchrun exits 1"
_STOP_FORK = "exit 130 and the workers' KeyboardInterrupt cleanup does not run (stopped, not interrupted)"
_ENV = ("resctl's rendezvous is c10d on 127.0.0.1:0 (ft_launcher) where torchrun's default is static on "
        "MASTER_PORT: MASTER_ADDR=localhost, TORCHELASTIC_RUN_ID=<run id>, TORCHELASTIC_USE_AGENT_STORE=False")
_MASTER = ("--master-addr/--master-port become the rendezvous endpoint: workers get another MASTER_PORT, "
           "MASTER_ADDR=localhost and TORCHELASTIC_USE_AGENT_STORE=False")

EXPECTED: dict[str, dict[str, str]] = {
    "end_sys_exit": {"fork": _HANG_EXIT},
    "end_sys_exit_none": {"fork": _HANG_EXIT},
    "end_raise_systemexit": {"fork": _HANG_EXIT},
    "end_os_exit_zero": {"fork": _HANG_EXIT},
    "end_keyboardinterrupt": {"fork": _HANG_EXIT},
    "out_lost_on_os_exit": {"fork": _HANG_EXIT},
    "end_exception": {"fork": _TRACE},
    "end_one_rank_fails": {"fork": _TRACE},
    "log_basic_info": {"fork": "the launcher's logging is inherited (root INFO with 2 handlers): basicConfig is a "
                               "no-op and the script's records do not reach the console"},
    "log_last_resort": {"fork": "the launcher's logging is inherited: the script's warnings do not reach the console"},
    "warn_show": {"fork": "the launcher's warning filters are inherited ('ignore'): the script's warnings are not "
                          "shown",
                  "exec": "the shim's imports (torch, NVRx) added their filters to warnings.filters before the "
                          "script (its warnings are shown)"},
    "excepthook": {"fork": "the script's sys.excepthook is not called"},
    "atexit_return": {"fork": "atexit handlers do not run"},
    "atexit_exception": {"fork": "atexit handlers do not run; " + _TRACE},
    "faulthandler_segv": {"fork": "faulthandler is on at start (inherited); its dump shows the shim's thread and "
                                  "the preloaded extension modules",
                          "exec": "faulthandler's dump shows the shim's thread and its extension modules"},
    "env_torchelastic": {"fork": _ENV, "exec": _ENV},
    "env_master_flags": {"fork": _MASTER, "exec": _MASTER},
    "main_identity": {"fork": _RUN_PATH, "exec": _RUN_PATH},
    "interpreter_state": {"fork": _PRELOAD, "exec": _PRELOAD},
    "stdin_read": {"fork": "a forked worker's stdin is not the launcher's (fd 11, reads nothing)"},
    "proc_identity": {"fork": _TITLE, "exec": _TITLE},
    "thread_nondaemon": {"fork": "a non-daemon thread can be cut off at exit (its last line lost)"},
    "threads_at_start": {"fork": _THREAD, "exec": _THREAD},
    "sig_int_worker": {"fork": "SIGINT to a forked worker raises no KeyboardInterrupt in the script: the worker "
                               "dies (exit 1)"},
    "sig_term_launcher": {"fork": "hang: SIGTERM to `resctl run` with workers that handle it and end with 0",
                          "exec": _STOP_CODE},
    "sig_int_launcher": {"fork": _STOP_FORK, "exec": _STOP_CODE},
    "sig_ctrl_c": {"fork": _STOP_FORK, "exec": _STOP_CODE},
    "sig_dispositions": {"fork": "the shim's SIGTERM handler and wakeup fd, and the launcher's SIGHUP/SIGQUIT "
                                 "handlers, are installed when the script starts",
                         "exec": "the shim's SIGTERM handler and wakeup fd are installed when the script starts"},
    "mp_fork_pool": {"fork": _POOL_SIGTERM, "exec": _POOL_SIGTERM},
    "mp_spawn_pool": {"fork": _HANG_SPAWN, "exec": _HANG_SPAWN},
    "mp_forkserver_pool": {"fork": _HANG_SPAWN, "exec": _HANG_SPAWN},
    "mp_state": {"fork": "the worker is a multiprocessing child of the launcher (ForkProcess-N, parent_process "
                         "set, start method 'fork')"},
    "dataloader_spawn": {"fork": "hang: spawned DataLoader workers cannot load the script's Dataset",
                         "exec": "spawned DataLoader workers cannot load the script's Dataset (AttributeError: "
                                 "Can't get attribute 'Squares' on <module '__main__'>)"},
    "rng_unseeded": {"fork": "str hashes are the same on every rank (a fork keeps the launcher's hash secret)"},
    "rng_torch": {"fork": "torch's unseeded generator is the same on every rank"},
}
