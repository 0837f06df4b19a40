"""The launch plan: golden argv per example profile and NVRx series, checked against the real parsers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from resctl.errors import UsageError
from resctl.launch.plan import SHIM_PATH, Target, plan
from resctl.launch.rendezvous import Rendezvous, detect
from resctl.profile.load import resolve

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "golden"
OPTIONS = REPO / "tests" / "fixtures" / "nvrx"
PROFILES = sorted((REPO / "examples" / "profiles").glob("*.toml"))
VERSIONS = ["0.4.1", "0.7.0"]
RDZV = Rendezvous(endpoint="train-0.svc:29500", run_id="job-1234", standalone=False, node_rank=0, nnodes=None,
                  is_host=True, source="explicit", notes=())
CWD = Path("/work/job")


def make(profile: Path | None, version: str, sets: tuple[str, ...] = (), target: Target | None = None):
    resolved = resolve(profile, env={}, sets=sets, cwd=Path("/nonexistent"))
    return plan(resolved, target or Target("train.py", ("--lr", "3e-4")), RDZV, version, user_env={}, cwd=CWD)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_golden_argv(profile: Path, version: str) -> None:
    got = ["{SHIM}" if a == str(SHIM_PATH) else a for a in make(profile, version).args]  # checkout-independent
    golden = GOLDEN / f"{profile.stem}-nvrx{version}.json"
    if os.environ.get("UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=1) + "\n")
    assert got == json.loads(golden.read_text()), f"argv changed; UPDATE_GOLDEN=1 rewrites {golden.name} if intended"


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.stem)
def test_041_argv_is_accepted_by_the_installed_launcher(profile: Path) -> None:
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

    ns = get_args_parser().parse_args(make(profile, "0.4.1").args)
    assert ns.training_script == str(SHIM_PATH) and ns.run_path and ns.start_method == "fork"
    exec_ns = get_args_parser().parse_args(make(profile, "0.4.1", sets=('launch.worker_start="exec"',)).args)
    assert exec_ns.training_script == "resctl.shim" and exec_ns.module
    assert ns.training_script_args == ["train.py", "--lr", "3e-4"]
    assert ns.rdzv_id == "job-1234"


@pytest.mark.parametrize("version", ["0.6.0", "0.7.0"])
def test_newer_argv_uses_only_options_that_version_has(version: str) -> None:
    known = set(OPTIONS.joinpath(f"ft_launcher-{version}-options.txt").read_text().split())
    for profile in PROFILES:
        args = make(profile, version, sets=("heartbeat.timeout=none",)).args
        launcher_args = args[: args.index("--run-path") + 1]  # what follows belongs to the script
        for arg in launcher_args:
            if arg.startswith("--"):
                assert arg in known, f"{arg} is not an ft_launcher {version} option"


def test_aws_eks_defaults() -> None:
    args = make(None, "0.4.1").args
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--ft-rank-heartbeat-timeout"] == "900"
    assert pairs["--ft-initial-rank-heartbeat-timeout"] == "1200"
    assert pairs["--monitor-interval"] == "5"


def test_restart_policy_follows_version_and_inprocess() -> None:
    def policy(version: str, *sets: str) -> str:
        args = make(None, version, sets=sets).args
        return args[args.index("--ft-restart-policy") + 1]

    assert policy("0.4.1") == "any-failed"
    assert policy("0.4.1", "inprocess.enabled=true") == "min-healthy"
    assert policy("0.7.0", "inprocess.enabled=true") == "any-failed"
    with pytest.raises(UsageError, match="min-healthy"):
        make(None, "0.7.0", sets=('launch.restart_policy="min-healthy"',))


def test_disabled_timeouts_per_series() -> None:
    p04 = make(None, "0.4.1", sets=("heartbeat.timeout=none",))
    assert "--ft-rank-heartbeat-timeout" not in p04.args
    cfg = p04.args[p04.args.index("--ft-cfg-path") + 1]
    assert p04.files[Path(cfg)] == "fault_tolerance:\n  rank_heartbeat_timeout: null\n"
    p07 = make(None, "0.7.0", sets=("heartbeat.timeout=none",))
    assert p07.args[p07.args.index("--ft-rank-heartbeat-timeout") + 1] == "none"


def test_target_forms() -> None:
    assert make(None, "0.4.1", target=Target("pkg.train", ("-x",), module=True)).args[-5:] == [
        "--run-path", str(SHIM_PATH), "--resctl-module", "pkg.train", "-x"]
    exec_plan = make(None, "0.4.1", sets=('launch.worker_start="exec"',), target=Target("pkg.train", ("-x",), module=True))
    assert exec_plan.args[-5:] == ["--module", "resctl.shim", "--resctl-module", "pkg.train", "-x"]
    assert "RESCTL_PRELOAD" not in exec_plan.env
    no_py = make(None, "0.4.1", target=Target("./run.sh", ("a",), no_python=True))
    assert no_py.args[-3:] == ["--no-python", "./run.sh", "a"] and "resctl.shim" not in no_py.args
    assert any("without resctl.shim" in n for n in no_py.notes)


def test_plan_hands_workers_the_resolved_profile() -> None:
    p = make(None, "0.4.1", sets=("checkpoint.interval_steps=7",))
    assert p.env["RESCTL_PLAN"] == str(CWD / "resctl-runs" / "job-1234" / "plan.json")
    data = json.loads(p.files[Path(p.env["RESCTL_PLAN"])])
    assert data["profile"]["checkpoint"]["interval_steps"] == 7 and data["run_id"] == "job-1234"


def test_inprocess_env_respects_the_user() -> None:
    resolved = resolve(None, env={}, sets=("inprocess.enabled=true",), cwd=Path("/nonexistent"))
    p = plan(resolved, Target("t.py"), RDZV, "0.4.1", user_env={"NCCL_NVLS_ENABLE": "1"}, cwd=CWD)
    assert p.env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0" and "NCCL_NVLS_ENABLE" not in p.env


def test_standalone_runs_get_unique_ids_and_port_zero() -> None:
    launch = resolve(None, env={}, cwd=Path("/nonexistent")).profile.launch
    a, b = detect(launch, {}, "laptop"), detect(launch, {}, "laptop")
    assert a.endpoint == b.endpoint == "localhost:0" and a.run_id != b.run_id and "none" not in a.run_id


def test_dry_run_layers_say_what_is_on_and_why() -> None:
    from resctl.launch.plan import recovery_layers
    from resctl.profile.schema import Profile

    off = recovery_layers(Profile(), "0.4", fork_workers=True)
    assert "in-job restart: on" in off[0] and "forked" in off[0] and "0.5s" in off[0]
    assert off[1].startswith("in-process restart: off")
    on = recovery_layers(Profile.model_validate({"inprocess": {"enabled": True}}), "0.7", fork_workers=False)
    assert "every rank" in on[1] and "exec" in on[0]
    assert "deprecated since NVRx 0.6" in on[2]


def test_the_memory_tier_is_replicated_only_with_more_than_one_node_and_both_keys_on(tmp_path: Path) -> None:
    on = ("checkpoint.memory_every=1", "launch.nnodes=2")
    assert make(None, "0.4.1", on).replica_port == 0
    assert make(None, "0.4.1", (*on, "checkpoint.memory_replicate_port=29600")).replica_port == 29600
    assert make(None, "0.4.1", ("checkpoint.memory_every=1", "launch.nnodes=1:2")).replica_port == 0
    assert make(None, "0.4.1", ("checkpoint.memory_every=1",)).replica_port is None  # one node: no buddy
    assert make(None, "0.4.1", ("launch.nnodes=2",)).replica_port is None  # no memory tier
    assert make(None, "0.4.1", (*on, "checkpoint.memory_replicate=false")).replica_port is None


def test_resctl_run_serves_the_replica_and_tells_the_workers_where(monkeypatch: pytest.MonkeyPatch) -> None:
    from resctl.checkpoint import replica, replica_wire
    from resctl.launch.execute import serve_replica

    p = make(None, "0.4.1", ("checkpoint.memory_every=1", "launch.nnodes=2"))
    env: dict[str, str] = {}
    monkeypatch.setenv(replica.HOST_ENV, "127.0.0.1")  # the rendezvous host of the fixture does not resolve
    server = serve_replica(p, env, lambda _line: None)
    assert server is not None
    try:
        host, port, secret = replica.parse_addr(env[replica.ADDR_ENV])
        assert (host, port, secret) == ("127.0.0.1", server.port, server.secret) and len(secret) == 32
        assert replica.listing(env[replica.ADDR_ENV], server.key, 0) == []
        with pytest.raises(replica_wire.WireError, match="not this server's job"):
            replica.listing(env[replica.ADDR_ENV], "another-job", 0)
        with pytest.raises(replica_wire.WireError, match="not authenticated"):  # without its secret
            replica.listing(f"127.0.0.1:{port}", server.key, 0)
    finally:
        server.close()
    assert serve_replica(make(None, "0.4.1"), env, lambda _line: None) is None


def test_a_replica_port_in_use_is_a_usage_error_naming_the_key() -> None:
    import socket

    from resctl.launch.execute import serve_replica

    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = make(None, "0.4.1", ("checkpoint.memory_every=1", "launch.nnodes=2", f"checkpoint.memory_replicate_port={port}"))
        with pytest.raises(UsageError, match="checkpoint.memory_replicate_port"):
            serve_replica(p, {}, lambda _line: None)


def test_resctls_rendezvous_is_the_default_on_every_nvrx_version() -> None:
    """launch.rendezvous: resctl's by default (auto) on NVRx 0.4 and 0.7 alike; NVRx's with min-healthy
    (in-process restart on 0.4) and with the "nvrx" opt-out; "resctl" with min-healthy is refused, naming
    the way out."""
    for version in ("0.4.1", "0.7.0"):
        on = make(None, version)
        assert on.env["RESCTL_RDZV"] == "resctl" and on.env["RESCTL_RDZV_KEEP_ALIVE"] == "1"
        assert on.env["RESCTL_RDZV_MISSES"] == "3"
        assert make(None, version, sets=('launch.rendezvous="resctl"',)).env == on.env
        off = make(None, version, sets=('launch.rendezvous="nvrx"',))
        assert "RESCTL_RDZV" not in off.env and off.args == on.args, "the launcher's command line is the same"
    tuned = make(None, "0.4.1", sets=("launch.rdzv_keep_alive=250ms", "launch.rdzv_keep_alive_misses=4"))
    assert tuned.env["RESCTL_RDZV_KEEP_ALIVE"] == "0.25" and tuned.env["RESCTL_RDZV_MISSES"] == "4"
    inproc = ("inprocess.enabled=true", "heartbeat.timeout=90s")
    assert "RESCTL_RDZV" not in make(None, "0.4.1", sets=inproc).env, "min-healthy keeps NVRx's"
    with pytest.raises(UsageError, match="any-failed"):
        make(None, "0.4.1", sets=(*inproc, 'launch.rendezvous="resctl"'))
