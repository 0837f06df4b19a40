"""What each NVRx ``ft_launcher`` series accepts: a data table for the launch plan.

NVRx changed ft_launcher's command line between 0.4.x and 0.6: the ``min-healthy`` restart
policy went away, heartbeat timeouts became strings that accept ``none`` and default to none
(hang detection off unless set), the missing-config flag was renamed, the ``--ft-param-*`` and
``--restart-policy`` aliases were dropped, and the launcher's own defaults moved. The plan asks
this module instead of comparing version strings itself::

    flags = nvrx_flags.for_version("0.7.0")
    if not flags.has_min_healthy: ...
    flags.defaults.monitor_interval      # 0.3

Every value here was read from the parser (``launcher.get_args_parser()``) and
``FaultToleranceConfig`` of the versions listed in ``Series.checked``; the option lists are kept
in ``tests/fixtures/nvrx/ft_launcher-<version>-options.txt`` (regenerate them with
``tests/fixtures/nvrx/extract_options.py``) and ``tests/unit/test_nvrx_flags.py`` checks this
table against them.

0.5.x is refused: it is a hybrid (``min-healthy`` still there, timeouts already accept ``none``,
heartbeat timeouts still default to 2700 s / 3600 s) that neither series describes.
"""

from __future__ import annotations

from dataclasses import dataclass

from resctl.profile.nvrx_versions import series_for  # the profile validates versions with it too

__all__ = [
    "LauncherDefaults",
    "Series",
    "SERIES",
    "supported_series",
    "series_for",
    "for_version",
]


@dataclass(frozen=True)
class LauncherDefaults:
    """What ft_launcher uses for a setting resctl leaves out of the command line (seconds)."""

    max_restarts: int
    monitor_interval: float
    workers_stop_timeout: float
    term_timeout: float
    # FaultToleranceConfig defaults (what an unset --ft-* flag falls back to); None disables.
    initial_rank_heartbeat_timeout: float | None
    rank_heartbeat_timeout: float | None
    rank_out_of_section_timeout: float | None
    workload_check_interval: float
    node_health_check_interval: float
    safety_factor: float
    restart_check_interval: float
    enable_nic_monitor: bool


@dataclass(frozen=True)
class Series:
    """One ft_launcher command-line dialect.

    Attributes:
        name: "0.4" or "0.6+".
        checked: versions whose parsers these values were read from.
        restart_policies: choices of ``--ft-restart-policy`` (the first is the default).
        has_min_healthy: ``--ft-restart-policy min-healthy`` is accepted.
        ignore_missing_cfg_flag: the flag that tells ft_launcher not to fail without an ft config,
            where every checked version of the series accepts it; None when some version would
            reject it. No checked version reads the flag's value, and none fails without a config
            once any ``--ft-*`` setting is given, so the plan never needs to pass it.
        heartbeat_timeouts_default_none: both heartbeat timeouts default to none, i.e. hang
            detection is off unless resctl sets them.
        timeouts_accept_none: ``--ft-*-timeout none`` (and ``null``, "") disables a timeout on the
            command line; otherwise the flags are floats and ``none`` is an argparse error, so a
            disabled timeout has to go through ``--ft-cfg-path`` YAML (``null``).
        rdzv_impl_flag: the flag selecting the rendezvous implementation, where one exists.
        gpu_reclaim_poll_flag: the flag setting how often a restart polls for the stopped workers'
            GPU memory to be released (0.6+: every 2 s by default, so a restart waits up to 2 s more
            than it needs), where one exists.
        no_progress_flag: the launcher's own no-progress stop (0.6+: `--ft-max-no-progress-cycles`, on by
            default at 3 but counting only a `--ft-checkpoint-iteration-file`), where one exists.
        legacy_aliases: ``--ft-param-*`` / ``--restart-policy`` spellings still accepted.
        defaults: the launcher's own defaults.
    """

    name: str
    checked: tuple[str, ...]
    restart_policies: tuple[str, ...]
    has_min_healthy: bool
    ignore_missing_cfg_flag: str | None
    heartbeat_timeouts_default_none: bool
    timeouts_accept_none: bool
    rdzv_impl_flag: str | None
    gpu_reclaim_poll_flag: str | None
    no_progress_flag: str | None
    legacy_aliases: bool
    defaults: LauncherDefaults


SERIES: dict[str, Series] = {
    "0.4": Series(
        name="0.4",
        checked=("0.4.1",),
        restart_policies=("any-failed", "min-healthy"),
        has_min_healthy=True,
        ignore_missing_cfg_flag="--ignore-missing-fault-tol-cfg",
        heartbeat_timeouts_default_none=False,
        timeouts_accept_none=False,
        rdzv_impl_flag=None,
        gpu_reclaim_poll_flag=None,
        no_progress_flag=None,
        legacy_aliases=True,
        defaults=LauncherDefaults(
            max_restarts=0,
            monitor_interval=0.1,
            workers_stop_timeout=30.0,
            term_timeout=1800.0,
            initial_rank_heartbeat_timeout=3600.0,
            rank_heartbeat_timeout=2700.0,
            rank_out_of_section_timeout=None,
            workload_check_interval=5.0,
            node_health_check_interval=5.0,
            safety_factor=5.0,
            restart_check_interval=60.0,
            enable_nic_monitor=True,
        ),
    ),
    "0.6+": Series(
        name="0.6+",
        checked=("0.6.0", "0.7.0"),
        restart_policies=("any-failed",),
        has_min_healthy=False,
        # 0.7 added --ft-ignore-missing-cfg; 0.6.0 has no such flag and would reject it.
        ignore_missing_cfg_flag=None,
        heartbeat_timeouts_default_none=True,
        timeouts_accept_none=True,
        rdzv_impl_flag="--ft-rdzv-impl",
        gpu_reclaim_poll_flag="--ft-gpu-memory-poll-interval",
        no_progress_flag="--ft-max-no-progress-cycles",
        legacy_aliases=False,
        defaults=LauncherDefaults(
            max_restarts=0,
            monitor_interval=0.3,
            workers_stop_timeout=15.0,
            term_timeout=1800.0,
            initial_rank_heartbeat_timeout=None,
            rank_heartbeat_timeout=None,
            rank_out_of_section_timeout=None,
            workload_check_interval=5.0,
            node_health_check_interval=5.0,
            safety_factor=5.0,
            restart_check_interval=60.0,
            enable_nic_monitor=False,
        ),
    ),
}


def supported_series() -> list[str]:
    """The series resctl can plan for, oldest first: ``["0.4", "0.6+"]``."""
    return list(SERIES)


def for_version(version: str) -> Series:
    """The `Series` row for an NVRx version string (see `series_for`)."""
    return SERIES[series_for(version)]
