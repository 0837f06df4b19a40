"""resctl.launch.nvrx_flags against the option lists extracted from real ft_launcher parsers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from resctl.errors import UsageError
from resctl.launch import nvrx_flags

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvrx"

# Flags a resctl plan may emit on every supported version.
COMMON = [
    "--nnodes", "--nproc-per-node", "--node-rank", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id",
    "--rdzv-conf", "--standalone", "--max-restarts", "--monitor-interval", "--term-timeout",
    "--workers-stop-timeout", "--start-method", "--local-addr", "--master-addr", "--master-port",
    "--log-dir", "-r", "-t", "-m", "--no-python", "--ft-cfg-path", "--ft-restart-policy",
    "--ft-initial-rank-heartbeat-timeout", "--ft-rank-heartbeat-timeout", "--ft-rank-section-timeouts",
    "--ft-rank-out-of-section-timeout", "--ft-workload-check-interval", "--ft-node-health-check-interval",
    "--ft-safety-factor", "--ft-rank-termination-signal", "--ft-log-level", "--ft-enable-nic-monitor",
]


def options(version: str) -> set[str]:
    lines = (FIXTURES / f"ft_launcher-{version}-options.txt").read_text().splitlines()
    return {line for line in lines if line}


def parser_facts(version: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / f"ft_launcher-{version}-defaults.json").read_text())
    return data


ALL_CHECKED = [(s.name, v) for s in nvrx_flags.SERIES.values() for v in s.checked]


def test_supported_series() -> None:
    assert nvrx_flags.supported_series() == ["0.4", "0.6+"]


@pytest.mark.parametrize(
    ("version", "series"),
    [("0.4.1", "0.4"), ("0.4.0", "0.4"), ("0.6.0", "0.6+"), ("0.7.0", "0.6+"), ("0.7.0rc1", "0.6+"),
     ("0.7.3", "0.6+"), ("0.4.1+cuda12", "0.4")],
)
def test_series_for(version: str, series: str) -> None:
    assert nvrx_flags.series_for(version) == series


@pytest.mark.parametrize("version", ["0.5.0", "0.3.9", "", "latest", "0.8.0", "0.10.2", "1.0"])
def test_series_for_refuses(version: str) -> None:
    """Older, 0.5 and newer than resctl was checked on (issue 30): refused, naming the supported range."""
    with pytest.raises(UsageError) as err:
        nvrx_flags.series_for(version)
    assert "0.4" in str(err.value)
    if version[:1].isdigit() and version not in ("0.5.0", "0.3.9"):
        assert "0.4.x or 0.6.x-0.7.x" in str(err.value) and "checked on 0.4.1, 0.6.0, 0.7.0" in str(err.value)


@pytest.mark.parametrize(("series", "version"), ALL_CHECKED)
def test_fixture_exists_for_every_checked_version(series: str, version: str) -> None:
    assert nvrx_flags.series_for(version) == series
    assert options(version), version


@pytest.mark.parametrize(("series", "version"), ALL_CHECKED)
def test_common_flags_accepted(series: str, version: str) -> None:
    assert not set(COMMON) - options(version)


@pytest.mark.parametrize(("series", "version"), ALL_CHECKED)
def test_restart_policies(series: str, version: str) -> None:
    row = nvrx_flags.SERIES[series]
    arg = parser_facts(version)["args"]["--ft-restart-policy"]
    assert tuple(arg["choices"]) == row.restart_policies
    assert arg["default"] == row.restart_policies[0]
    assert row.has_min_healthy == ("min-healthy" in arg["choices"])


@pytest.mark.parametrize(("series", "version"), ALL_CHECKED)
def test_ignore_missing_cfg_flag(series: str, version: str) -> None:
    flag = nvrx_flags.SERIES[series].ignore_missing_cfg_flag
    if flag is not None:
        assert flag in options(version)


def test_ignore_missing_cfg_renamed() -> None:
    assert "--ignore-missing-fault-tol-cfg" in options("0.4.1")
    assert "--ft-ignore-missing-cfg" not in options("0.4.1")
    assert "--ft-ignore-missing-cfg" not in options("0.6.0")  # why the 0.6+ row says None
    assert "--ft-ignore-missing-cfg" in options("0.7.0")
    assert "--ignore-missing-fault-tol-cfg" not in options("0.7.0")


@pytest.mark.parametrize(("series", "version"), ALL_CHECKED)
def test_heartbeat_timeouts(series: str, version: str) -> None:
    row = nvrx_flags.SERIES[series]
    facts = parser_facts(version)
    cfg = facts["ft_config"]
    d = row.defaults
    assert cfg["initial_rank_heartbeat_timeout"] == d.initial_rank_heartbeat_timeout
    assert cfg["rank_heartbeat_timeout"] == d.rank_heartbeat_timeout
    assert row.heartbeat_timeouts_default_none == (
        cfg["rank_heartbeat_timeout"] is None and cfg["initial_rank_heartbeat_timeout"] is None
    )
    for flag in ("--ft-rank-heartbeat-timeout", "--ft-initial-rank-heartbeat-timeout", "--ft-rank-out-of-section-timeout"):
        # str-typed timeouts are parsed by FaultToleranceConfig, which maps none/null/"" to None.
        assert (facts["args"][flag]["type"] == "str") == row.timeouts_accept_none, flag


@pytest.mark.parametrize(("series", "version"), ALL_CHECKED)
def test_launcher_defaults(series: str, version: str) -> None:
    d = nvrx_flags.SERIES[series].defaults
    facts = parser_facts(version)
    args, cfg = facts["args"], facts["ft_config"]
    assert args["--max-restarts"]["default"] == d.max_restarts
    assert args["--monitor-interval"]["default"] == d.monitor_interval
    assert args["--workers-stop-timeout"]["default"] == d.workers_stop_timeout
    assert args["--term-timeout"]["default"] == d.term_timeout
    for name in ("rank_out_of_section_timeout", "workload_check_interval", "node_health_check_interval",
                 "safety_factor", "restart_check_interval"):
        assert cfg[name] == getattr(d, name), name
    # 0.4.1's parser defaults --ft-enable-nic-monitor to True itself; later versions leave it to the config.
    nic = args["--ft-enable-nic-monitor"]["default"]
    assert (nic if nic is not None else cfg["enable_nic_monitor"]) == d.enable_nic_monitor


@pytest.mark.parametrize(("series", "version"), ALL_CHECKED)
def test_rdzv_impl_and_aliases(series: str, version: str) -> None:
    row = nvrx_flags.SERIES[series]
    opts = options(version)
    if row.rdzv_impl_flag is None:
        assert not any(o.startswith("--ft-rdzv-impl") for o in opts)
    else:
        assert row.rdzv_impl_flag in opts
    legacy = {o for o in opts if o.startswith(("--ft-param-", "--ft_param_")) or o in {"--restart-policy", "--restart_policy"}}
    assert bool(legacy) == row.legacy_aliases


def test_for_version() -> None:
    assert nvrx_flags.for_version("0.4.1") is nvrx_flags.SERIES["0.4"]
    assert nvrx_flags.for_version("0.7.0").defaults.monitor_interval == 0.3
