"""How resctl changes NVRx's `ft_launcher` and torch elastic, applied once by `resctl.launch.ft_entry`
before the launcher runs, and undone in every process forked from it.

The launcher's behaviour lives in resctl's agent (`resctl.launch.agent.ResctlAgent`), which ft_launcher
builds instead of its own (`agent.install`). What is left here cannot be a method of that agent:

- **No abbreviations.** A script's argument (`--workers`) is never read as an abbreviation of a
  launcher option (`--workers-stop-timeout`): argparse's `allow_abbrev` is off (`_no_abbreviations`).
- **Rank monitors** are forked before the agent exists: each names itself (`resctl-rank-monitor
  local=N`), stays in the launcher's process group, dies with it, and writes to launcher.log.
- **resctl's rendezvous** (the default; `launch.rendezvous = "nvrx"` opts out; issues 25, 30). The
  `c10d` handler ft_launcher registers is `resctl.launch.owned_rdzv`'s, on every NVRx version, installed
  by `resctl.launch.rdzv_install.install` (`_owned_rendezvous`): O(1) store requests per node and
  round, no wait for a lost node's keep-alive to expire before a restart round, the keep-alive
  interval from the profile. On NVRx 0.4/0.5 the agent (`ResctlAgent._rendezvous`,
  `_share_and_gather`) takes each node's local world size from the round's outcome.
- **Exec'd workers start in a standby** where one is ready (`resctl.launch.standby.install`: torch elastic's
  handler, through resctl's subclass of it).
- **Processes forked from the launcher** (workers, rank monitors) get NVRx's code unpatched, a process
  group of their own and a SIGTERM when the launcher dies (`install_fork_hook`).

Every private NVRx/torch name used here or in the agent is listed in `resctl.launch.nvrx_private`.
"""

from __future__ import annotations

import gc
import os
import re
import signal
from typing import Any

from resctl.launch import fork_signals, launcher_logs, lifeline, rdzv_install, spares, standby
from resctl.launch.launcher_logs import monitor_to_log
from resctl.launch.titles import set_title
from resctl.patching import Patches

PATCHES = Patches("launcher")


def _titled_rank_monitors(patches: Patches) -> None:
    """Rank monitors are forked from the launcher too: name them (`resctl-rank-monitor local=N`)."""
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

    run = RankMonitorServer.run

    def titled_run(*args: Any, **kwargs: Any) -> Any:
        local = re.search(r"rmon(\d+)\.socket$", str(kwargs.get("ipc_socket_path", "")))
        set_title("resctl-rank-monitor" + (f" local={local[1]}" if local else ""))
        try:  # monitors stay in the launcher's process group (a worker's group is its own) ...
            os.setpgid(0, os.getpgid(os.getppid()))
        except OSError:
            pass
        _die_with_parent(signal.SIGKILL)  # ... and never outlive it (they hold its stdout open)
        monitor_to_log()  # what it logs is the launcher's log, not the console
        return run(*args, **kwargs)

    patches.set(RankMonitorServer, "run", staticmethod(titled_run))


def _child_of_launcher(launcher_pid: int) -> None:
    """In every process forked from the launcher (workers, rank monitors): NVRx's code unpatched, a
    process group of its own, so a launcher's `killpg` of a worker's group reaches the worker and its
    children, never the launcher, `resctl run` or the shell that started them, and a SIGTERM when the
    launcher dies (a worker then stops as for a job stop; an unsupervised worker has no future)."""
    if os.getppid() != launcher_pid:
        return  # a fork inside a worker (the hook is inherited): NVRx's monitor setsid()s, DataLoader workers...
    # What the launcher imported (torch, NVRx, the shim: ~10^5 objects) is never garbage here: out of the
    # collector's sight, a worker's collections walk only its own objects and dirty no inherited page (the
    # worker's end collects the script's module: 0.11 s of walking torch on a 2-core VM before this).
    gc.freeze()
    undo_adapters()
    launcher_logs.IN_LAUNCHER.undo()
    try:  # not a session of its own, as torchrun's (start_new_session): measured, a new session per
        os.setpgid(0, 0)  # worker made an in-job restart ~0.15 s slower on a loaded 2-core VM (autogroups)
    except OSError:
        pass
    _die_with_parent(signal.SIGTERM)


def _die_with_parent(sig: int) -> None:
    lifeline.die_with_parent(sig)


def _no_abbreviations(patches: Patches) -> None:
    """The script's own arguments are never taken for the launcher's.

    argparse matches abbreviated options while it scans the whole command line, the script's
    arguments included, so `resctl run train.py --workers 0` failed with "ambiguous option: --workers
    could match --workers-stop-timeout, ..." (NVRx's options; torchrun has none starting so). resctl
    writes every launcher option in full, so abbreviations are off."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    if not hasattr(launcher, "get_args_parser"):
        return
    get_args_parser = launcher.get_args_parser

    def parser_without_abbreviations(*args: Any, **kwargs: Any) -> Any:
        parser = get_args_parser(*args, **kwargs)
        parser.allow_abbrev = False
        return parser

    patches.set(launcher, "get_args_parser", parser_without_abbreviations)


def _owned_rendezvous(patches: Patches) -> None:
    """ft_launcher's `c10d` rendezvous handler is resctl's when the plan asks for it
    (`rdzv_rounds.IMPL_ENV`; the default on every NVRx version): `resctl.launch.rdzv_install`."""
    rdzv_install.install(patches, agent_methods=False)  # ResctlAgent does NVRx 0.4's two agent methods


def apply_adapters() -> list[str]:
    """Install resctl's agent and what it cannot do itself (once); returns what was changed."""
    if PATCHES:
        return []
    from resctl.launch import agent

    agent.install(PATCHES)
    _owned_rendezvous(PATCHES)
    _no_abbreviations(PATCHES)
    _titled_rank_monitors(PATCHES)
    spares.spare_lines(PATCHES)
    standby.install(PATCHES)
    return PATCHES.applied


def undo_adapters() -> None:
    PATCHES.undo()


def launcher_exit_code(code: int) -> int:
    """The launcher's exit code: 128+N when signal N stopped the job and it did not end well
    (`agent.JobStop.exit_code`); `code` when no agent ran."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    from resctl.launch.agent import LauncherClock

    clock = launcher.time
    agent = clock.agent if isinstance(clock, LauncherClock) else None
    return code if agent is None else agent.job_stop.exit_code(code)


def install_fork_hook(launcher_pid: int) -> None:
    """Look after every process forked from `launcher_pid` (`_child_of_launcher`)."""
    os.register_at_fork(after_in_child=lambda: _child_of_launcher(launcher_pid))
    fork_signals.install()  # a SIGTERM while a worker is forked ends it, not the launcher's handler in it
