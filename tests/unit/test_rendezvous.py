"""resctl.launch.rendezvous: detection from fixture environments, and the Slurm hostlist parser."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from resctl.errors import UsageError
from resctl.launch.rendezvous import Rendezvous, detect, expand_hostlist, first_host, fresh_run_id
from resctl.profile.schema import Launch

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "env"


def fresh() -> str:
    return "fresh-id"


def load(name: str, tmp_path: Path, **launch: Any) -> tuple[Launch, dict[str, str], str, Path]:
    """A fixture's Launch section, env, hostname and a root holding its files."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    for rel, text in data["files"].items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Launch(**{**data["launch"], **launch}), data["env"], data["hostname"], tmp_path


def run(name: str, tmp_path: Path, **launch: Any) -> Rendezvous:
    cfg, env, hostname, root = load(name, tmp_path, **launch)
    return detect(cfg, env, hostname, root=root, new_id=fresh)


def bare(r: Rendezvous) -> Rendezvous:
    return dataclasses.replace(r, notes=())


EXPECTED = {
    "k8s-indexed-rank0": Rendezvous(
        endpoint="llama-ft-0.llama-ft.training.svc.cluster.local:29500",
        run_id="llama-ft-5f0c1e2a",
        standalone=False,
        node_rank=0,
        nnodes=None,
        is_host=True,
        source="kubernetes-indexed-job",
        notes=(),
    ),
    "k8s-indexed-rank2": Rendezvous(
        endpoint="llama-ft-0.llama-ft.ml.svc.corp.example:29400",
        run_id="llama-ft",
        standalone=False,
        node_rank=2,
        nnodes=None,
        is_host=False,
        source="kubernetes-indexed-job",
        notes=(),
    ),
    "pytorchjob": Rendezvous(
        endpoint="bert-master-0:23456",
        run_id="bert",
        standalone=False,
        node_rank=1,
        nnodes="2",
        is_host=False,
        source="pytorchjob",
        notes=(),
    ),
    "pytorchjob-elastic": Rendezvous(
        endpoint="gpt-worker-0:29400",
        run_id="gpt-elastic",
        standalone=False,
        node_rank=None,
        nnodes="2:4",
        is_host=None,
        source="pytorchjob",
        notes=(),
    ),
    "slurm-multinode": Rendezvous(
        endpoint="p5-001:29500",
        run_id="slurm-4242",
        standalone=False,
        node_rank=2,
        nnodes="6",
        is_host=False,
        source="slurm",
        notes=(),
    ),
    "laptop": Rendezvous(
        endpoint="localhost:0",
        run_id="fresh-id",
        standalone=True,
        node_rank=0,
        nnodes=None,
        is_host=True,
        source="standalone",
        notes=(),
    ),
}


def test_every_fixture_has_an_expectation() -> None:
    assert sorted(p.stem for p in FIXTURES.glob("*.json")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture(name: str, tmp_path: Path) -> None:
    r = run(name, tmp_path)
    assert bare(r) == EXPECTED[name]
    assert r.notes and all(isinstance(n, str) and n for n in r.notes)
    assert r.run_id and r.run_id.lower() != "none"


def test_notes_explain_the_choice(tmp_path: Path) -> None:
    notes = "\n".join(run("k8s-indexed-rank2", tmp_path).notes)
    assert "completion index 2" in notes
    assert "POD_NAMESPACE" in notes
    assert "JOB_UID" in notes  # tells the user how to tell two Jobs of one name apart
    assert "stays the same when a pod restarts" in notes


def test_does_not_read_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    assert bare(run("laptop", tmp_path)) == EXPECTED["laptop"]


# --- Kubernetes --------------------------------------------------------------------------------


def test_indexed_job_run_id_is_stable_across_pod_restarts(tmp_path: Path) -> None:
    cfg, env, _, root = load("k8s-indexed-rank0", tmp_path)
    # A restarted pod keeps its index and hostname but has a new pod name and pod uid.
    first = detect(cfg, {**env, "POD_UID": "aaaa"}, "llama-ft-0", root=root, new_id=fresh_run_id)
    again = detect(cfg, {**env, "POD_UID": "bbbb"}, "llama-ft-0", root=root, new_id=fresh_run_id)
    peer = detect(cfg, {**env, "JOB_COMPLETION_INDEX": "3"}, "llama-ft-3", root=root, new_id=fresh_run_id)
    assert first.run_id == again.run_id == peer.run_id
    rerun = detect(cfg, {**env, "JOB_UID": "77aa0000-0000-0000-0000-000000000000"}, "llama-ft-0", root=root)
    assert rerun.run_id == "llama-ft-77aa0000" != first.run_id


def test_indexed_job_without_service_says_what_to_set(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="launch.k8s_service"):
        run("k8s-indexed-rank0", tmp_path, k8s_service="")


def test_indexed_job_namespace_precedence(tmp_path: Path) -> None:
    cfg, env, hostname, root = load("k8s-indexed-rank0", tmp_path, k8s_namespace="prod")
    assert detect(cfg, {**env, "POD_NAMESPACE": "ml"}, hostname, root=root).endpoint.startswith("llama-ft-0.llama-ft.prod.svc.")
    cfg = Launch(k8s_service="llama-ft", nnodes="4")
    assert ".ml.svc." in detect(cfg, {**env, "POD_NAMESPACE": "ml"}, hostname, root=root).endpoint
    assert ".training.svc." in detect(cfg, env, hostname, root=root).endpoint


def test_indexed_job_without_namespace(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="launch.k8s_namespace"):
        detect(Launch(k8s_service="s", nnodes="2"), {"JOB_COMPLETION_INDEX": "0"}, "j-0", root=tmp_path)


def test_indexed_job_name_from_pod_name_or_env(tmp_path: Path) -> None:
    cfg = Launch(k8s_service="svc", k8s_namespace="ns", nnodes="2")
    env = {"JOB_COMPLETION_INDEX": "1"}
    assert detect(cfg, env, "train-1-x7k2p", root=tmp_path).endpoint == "train-0.svc.ns.svc.cluster.local:29500"
    named = detect(cfg, {**env, "JOB_NAME": "train"}, "ip-10-0-0-7", root=tmp_path)
    assert named.endpoint == "train-0.svc.ns.svc.cluster.local:29500"
    with pytest.raises(UsageError, match="JOB_NAME"):
        detect(cfg, env, "ip-10-0-0-7", root=tmp_path)


def test_indexed_job_index_beyond_nnodes(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="launch.nnodes"):
        run("k8s-indexed-rank2", tmp_path, nnodes="2")


def test_profile_rdzv_id_wins(tmp_path: Path) -> None:
    assert run("k8s-indexed-rank0", tmp_path, rdzv_id="exp-42").run_id == "exp-42"
    assert run("slurm-multinode", tmp_path, rdzv_id="exp-42").run_id == "exp-42"
    assert run("laptop", tmp_path, rdzv_id="exp-42").run_id == "exp-42"
    # torchrun's default "none" would make every job share one id: treated as auto.
    assert run("laptop", tmp_path, rdzv_id="none").run_id == "fresh-id"


# --- PyTorchJob ----------------------------------------------------------------------------------


def test_pytorchjob_master_is_host(tmp_path: Path) -> None:
    cfg, env, _, root = load("pytorchjob", tmp_path)
    master = detect(cfg, {**env, "RANK": "0", "PET_NODE_RANK": "0"}, "bert-master-0", root=root)
    assert (master.node_rank, master.is_host, master.run_id) == (0, True, "bert")


def test_pytorchjob_old_operator_world_size_is_nodes(tmp_path: Path) -> None:
    env = {"MASTER_ADDR": "bert-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3", "RANK": "2"}
    r = detect(Launch(), env, "bert-worker-1", root=tmp_path)
    assert (r.endpoint, r.node_rank, r.nnodes, r.is_host) == ("bert-master-0:23456", 2, "3", False)


def test_pytorchjob_nnodes_conflict(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="launch.nnodes = 8"):
        run("pytorchjob", tmp_path, nnodes="8")
    kept = run("pytorchjob", tmp_path, nnodes="1:4")
    assert kept.nnodes is None


# --- Slurm ---------------------------------------------------------------------------------------


def test_slurm_node_zero_hosts(tmp_path: Path) -> None:
    cfg, env, _, root = load("slurm-multinode", tmp_path)
    r = detect(cfg, {**env, "SLURM_NODEID": "0", "SLURM_PROCID": "0"}, "p5-001", root=root)
    assert (r.endpoint, r.node_rank, r.is_host) == ("p5-001:29500", 0, True)


def test_slurm_single_node_uses_a_free_local_port(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "gpu9"}
    r = detect(Launch(), env, "gpu9", root=tmp_path)
    assert bare(r) == Rendezvous("localhost:0", "slurm-77", True, 0, None, True, "slurm", ())


def test_slurm_one_task_per_node(tmp_path: Path) -> None:
    cfg, env, hostname, root = load("slurm-multinode", tmp_path)
    with pytest.raises(UsageError, match="ntasks-per-node=1"):
        detect(cfg, {**env, "SLURM_LOCALID": "3"}, hostname, root=root)


def test_slurm_batch_script_warns(tmp_path: Path) -> None:
    cfg, env, hostname, root = load("slurm-multinode", tmp_path)
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_STEP_")}
    r = detect(cfg, env, hostname, root=root)
    assert r.endpoint == "p5-001:29500"
    assert any("srun" in n for n in r.notes)


# --- explicit and standalone -----------------------------------------------------------------


def test_explicit_endpoint(tmp_path: Path) -> None:
    r = detect(Launch(rdzv_endpoint="10.0.0.5:29400", rdzv_id="job7", nnodes="2"), {}, "n1", root=tmp_path)
    assert bare(r) == Rendezvous("10.0.0.5:29400", "job7", False, None, None, None, "explicit", ())


def test_explicit_endpoint_without_port_uses_rdzv_port(tmp_path: Path) -> None:
    r = detect(Launch(rdzv_endpoint="head", rdzv_port=29411), {}, "n1", root=tmp_path, new_id=fresh)
    assert (r.endpoint, r.run_id) == ("head:29411", "fresh-id")


def test_explicit_ipv6(tmp_path: Path) -> None:
    r = detect(Launch(rdzv_endpoint="[fd00::5]:29400", rdzv_id="x"), {}, "n1", root=tmp_path)
    assert r.endpoint == "[fd00::5]:29400"
    with pytest.raises(ValidationError, match="IPv6"):  # the schema refuses it: validate and run agree
        Launch(rdzv_endpoint="fd00::5:29400", rdzv_id="x")


def test_explicit_endpoint_borrows_the_scheduler_run_id(tmp_path: Path) -> None:
    cfg, env, hostname, root = load("slurm-multinode", tmp_path, rdzv_endpoint="login1:29400", nnodes="6")
    r = detect(cfg, env, hostname, root=root)
    assert (r.endpoint, r.run_id, r.source) == ("login1:29400", "slurm-4242", "explicit")


def test_explicit_multinode_needs_a_shared_run_id(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="launch.rdzv_id"):
        detect(Launch(rdzv_endpoint="head:29400", nnodes="2"), {}, "n1", root=tmp_path)


def test_master_addr(tmp_path: Path) -> None:
    r = detect(Launch(master_addr="head", master_port=1234, rdzv_id="j"), {}, "n1", root=tmp_path)
    # the rendezvous store is the workers' store, as under torchrun: the master port is both
    assert (r.endpoint, r.source) == ("head:1234", "explicit")
    r = detect(Launch(master_addr="head", rdzv_id="j"), {}, "n1", root=tmp_path)
    assert r.endpoint == "head:29500"
    with pytest.raises(ValidationError, match="different hosts"):
        Launch(master_addr="a", rdzv_endpoint="b:1", rdzv_id="j")


def test_a_standalone_master_port_is_the_rendezvous_port(tmp_path: Path) -> None:
    assert detect(Launch(master_port=4321), {}, "n1", root=tmp_path).endpoint == "127.0.0.1:4321"
    assert detect(Launch(), {}, "n1", root=tmp_path).endpoint == "localhost:0"  # a free port, no collisions


def test_standalone_flag(tmp_path: Path) -> None:
    cfg, env, hostname, root = load("slurm-multinode", tmp_path, standalone=True, nnodes="1")
    r = detect(cfg, env, hostname, root=root, new_id=fresh)
    assert bare(r) == Rendezvous("localhost:0", "fresh-id", True, 0, None, True, "standalone", ())
    with pytest.raises(ValidationError, match="launch.standalone"):
        Launch(standalone=True, rdzv_endpoint="h:1")


def test_standalone_refuses_many_nodes(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="launch.rdzv_endpoint"):
        run("laptop", tmp_path, nnodes="2")
    with pytest.raises(ValidationError, match="launch.nnodes"):
        run("laptop", tmp_path, standalone=True, nnodes="1:2")


def test_fresh_run_ids_differ() -> None:
    ids = {fresh_run_id() for _ in range(50)}
    assert len(ids) == 50 and all(i != "none" for i in ids)


# --- hostlists -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu9", ["gpu9"]),
        ("a,b,c", ["a", "b", "c"]),
        ("p5-[001-004,007],gpu9", ["p5-001", "p5-002", "p5-003", "p5-004", "p5-007", "gpu9"]),
        ("node[8-11]", ["node8", "node9", "node10", "node11"]),
        ("node[08-11]", ["node08", "node09", "node10", "node11"]),
        ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
        ("rack[2]-gpu[3,5]-x", ["rack2-gpu3-x", "rack2-gpu5-x"]),
        ("a-[1-2],b-[3],c", ["a-1", "a-2", "b-3", "c"]),
        ("ip-10-0-0-[5-6].ec2.internal", ["ip-10-0-0-5.ec2.internal", "ip-10-0-0-6.ec2.internal"]),
        (" x[1-2] ", ["x1", "x2"]),
    ],
)
def test_expand_hostlist(nodelist: str, hosts: list[str]) -> None:
    assert expand_hostlist(nodelist) == hosts
    assert first_host(nodelist) == hosts[0]


def test_first_host_does_not_expand_everything() -> None:
    assert first_host("big[000000-999999],x") == "big000000"


@pytest.mark.parametrize("bad", ["", "n[1-2", "n1-2]", "n[2-1]", "n[a-b]", "n[1,,2]", "n[[1]]", "n[]"])
def test_bad_hostlists(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_hostlist(bad) if bad else first_host(bad)


def test_bad_nodelist_is_a_usage_error(tmp_path: Path) -> None:
    cfg, env, hostname, root = load("slurm-multinode", tmp_path)
    with pytest.raises(UsageError, match="SLURM_STEP_NODELIST"):
        detect(cfg, {**env, "SLURM_STEP_NODELIST": "p5-[001"}, hostname, root=root)


def test_the_profile_parses_endpoints_and_node_ranges_once_into_typed_fields() -> None:
    from resctl.profile.schema import Endpoint, NodeRange

    launch = Launch(nnodes="2:4", rdzv_endpoint="[fd00::1]:29400")
    assert launch.node_range == NodeRange(2, 4) and launch.node_range.max == 4
    assert launch.endpoint == Endpoint("fd00::1", 29400) and str(launch.endpoint) == "[fd00::1]:29400"
    assert Launch(rdzv_endpoint="head", rdzv_port=1234).endpoint == Endpoint("head", 1234)
    assert Launch().endpoint is None  # auto: the rendezvous detection decides
    rdzv = Rendezvous(endpoint="h:29500", run_id="r", standalone=False, node_rank=None, nnodes=None, is_host=None,
                      source="explicit", notes=())
    assert rdzv.address() == Endpoint("h", 29500) and rdzv.node_range(launch) == NodeRange(2, 4)
    assert dataclasses.replace(rdzv, nnodes="3").node_range(launch) == NodeRange(3, 3)  # the scheduler's count wins
