"""The deployment kits, simulated the way a cluster would run them, for N = 1, 2 and 4 nodes.

Kubernetes: render examples/kubernetes with envsubst's rules, then for every pod index build what
the kubelet gives each container -- hostname ``<job>-<index>``, the Job's env with the downward API
filled in, ``JOB_COMPLETION_INDEX``, the image's ENV (from the Dockerfile), the ConfigMap mounted as
files -- and run the container's own command through resctl's CLI: the train container with
``--dry-run`` added, the doctor init container against the healthy p5 fixture tree (``--root``).
Cluster DNS is the one thing simulated: names of the Job's pods resolve once "published" (all of
them here; tests/unit/test_grace.py covers the wait for a late pod 0).

Slurm: every node of an N-node allocation runs examples/profiles/slurm-p5.toml with its own SLURM_*
environment, as `srun --ntasks-per-node=1` gives it.

Every container at every index must resolve the same node count and rendezvous endpoint.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from resctl.cli import app
from resctl.profile.load import resolve
from tests.unit.test_deploy_kit import KIT, REPO, render

NAMESPACE = "ml-team"
JOB_UID = "0f9c2e1a-7b7d-4c43-9a57-3d5f0e3b9c11"
NODE_FIXTURE = REPO / "tests" / "fixtures" / "nodes" / "p5-healthy"
SIZES = [1, 2, 4]


def image_env() -> dict[str, str]:
    """The ENV of examples/kubernetes/Dockerfile that does not depend on the base image."""
    text = (KIT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            for word in shlex.split(line[4:]):
                name, _, value = word.partition("=")
                if "$" not in value:
                    env[name] = value
    return env


def image_files() -> dict[str, Path]:
    """Where the image's COPY puts the example scripts: /workspace/<name> -> the file in this repository."""
    files = {}
    for line in (KIT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and words[-1].startswith("/workspace"):
            for src in words[1:-1]:
                files[f"{words[-1].rstrip('/')}/{Path(src).name}"] = REPO / src
    return files


@dataclass
class Pod:
    index: int
    hostname: str
    fqdn: str
    root: Path  # stands for the container's filesystem: mounted volumes live under it


def downward(env_list: list[dict[str, Any]], job: str) -> dict[str, str]:
    fields = {"metadata.namespace": NAMESPACE,
              "metadata.labels['batch.kubernetes.io/controller-uid']": JOB_UID,
              "metadata.labels['batch.kubernetes.io/job-name']": job,
              "spec.nodeName": "ip-10-1-0-7.us-west-2.compute.internal"}
    out = {}
    for item in env_list:
        if "value" in item:
            out[item["name"]] = str(item["value"])
        else:
            out[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return out


class Cluster:
    """One rendered kit: the Job, its ConfigMap and the DNS names of its pods."""

    def __init__(self, nodes: int, tmp: Path) -> None:
        # rendered for the namespace the pods run in, as the README's values.env does
        (self.job,) = render("job.yaml", NODES=str(nodes), NAMESPACE=NAMESPACE)
        (self.configmap,) = render("profile-configmap.yaml", NODES=str(nodes), NAMESPACE=NAMESPACE)
        (self.service,) = render("headless-service.yaml", NODES=str(nodes), NAMESPACE=NAMESPACE)
        _, store = render("rendezvous-store.yaml", NODES=str(nodes), NAMESPACE=NAMESPACE)  # its Deployment, Service
        self.store_fqdn = f"{store['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
        self.nodes, self.tmp = nodes, tmp
        self.name = self.job["metadata"]["name"]
        self.spec = self.job["spec"]["template"]["spec"]
        self.pods = [self._pod(i) for i in range(nodes)]
        self.dns = {p.fqdn: f"10.1.0.{p.index + 10}" for p in self.pods}
        self.dns[self.store_fqdn] = "172.20.9.9"  # the store Service's cluster IP

    def _pod(self, index: int) -> Pod:
        hostname = f"{self.name}-{index}"  # the Job controller names Indexed Job pods' hosts this way
        fqdn = f"{hostname}.{self.spec['subdomain']}.{NAMESPACE}.svc.cluster.local"
        root = self.tmp / f"pod-{index}"
        for volume in self.spec["volumes"]:
            if "configMap" in volume:
                assert volume["configMap"]["name"] == self.configmap["metadata"]["name"]
                mount = next(m for m in self.spec["containers"][0]["volumeMounts"] if m["name"] == volume["name"])
                target = root / mount["mountPath"].lstrip("/")
                target.mkdir(parents=True)
                for key, text in self.configmap["data"].items():
                    (target / key).write_text(text)
        return Pod(index, hostname, fqdn, root)

    def containers(self) -> Iterator[dict[str, Any]]:
        yield from self.spec.get("initContainers", [])
        yield from self.spec["containers"]

    def env(self, pod: Pod, container: dict[str, Any]) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin"), "HOME": str(self.tmp / "home"),
            **image_env(),
            **downward(container.get("env", []), self.name),
            "JOB_COMPLETION_INDEX": str(pod.index),  # set by the Job controller in every container
            "KUBERNETES_SERVICE_HOST": "172.20.0.1", "KUBERNETES_SERVICE_PORT": "443",
        }

    def argv(self, pod: Pod, container: dict[str, Any]) -> list[str]:
        """The container's command, with paths inside the container mapped to this simulation."""
        mounts = {m["mountPath"]: pod.root / m["mountPath"].lstrip("/") for m in container["volumeMounts"]
                  if (pod.root / m["mountPath"].lstrip("/")).exists()}
        files = image_files()
        out = []
        for arg in container["command"]:
            for inside, outside in mounts.items():
                if arg.startswith(inside + "/"):
                    arg = str(outside) + arg[len(inside):]
            out.append(str(files.get(arg, arg)))
        assert out[0] == "resctl", container["name"]
        return out[1:]


@pytest.fixture
def in_pod(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Enter a pod: its hostname, its cluster DNS and exactly its environment."""
    real_getaddrinfo = socket.getaddrinfo

    def enter(cluster: Cluster, pod: Pod, env: dict[str, str]) -> None:
        def cluster_dns(host: Any, *args: Any, **kw: Any) -> Any:
            if isinstance(host, str) and host.endswith(".svc.cluster.local"):
                if host not in cluster.dns:
                    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
                return real_getaddrinfo(cluster.dns[host], *args, **kw)
            return real_getaddrinfo(host, *args, **kw)

        monkeypatch.setattr(socket, "gethostname", lambda: pod.hostname)
        monkeypatch.setattr(socket, "getfqdn", lambda name="": pod.fqdn)
        monkeypatch.setattr(socket, "getaddrinfo", cluster_dns)
        for name in list(os.environ):
            monkeypatch.delenv(name)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.chdir(pod.root)

    return enter


def dry_run(argv: list[str]) -> tuple[str, str]:
    """(nnodes, rdzv endpoint) from the launcher command `resctl run --dry-run` prints."""
    assert argv[0] == "run"
    result = CliRunner().invoke(app, ["run", "--dry-run", *argv[1:]])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    command = shlex.split(lines[lines.index("# command") + 1])
    return command[command.index("--nnodes") + 1], command[command.index("--rdzv-endpoint") + 1]


def doctor(argv: list[str], root: Path) -> dict[str, Any]:
    assert argv[0] == "doctor"
    result = CliRunner().invoke(app, [*argv, "--root", str(root), "--json"])
    doc: dict[str, Any] = json.loads(result.stdout)
    failed = [(p["name"], c) for p in doc["probes"] for c in p["checks"] if c["status"] == "FAIL"]
    assert result.exit_code == 0 and not failed, failed
    return doc


@pytest.mark.parametrize("nodes", SIZES)
def test_every_container_of_every_pod_resolves_the_same_launch(nodes: int, tmp_path: Path, in_pod: Any) -> None:
    cluster = Cluster(nodes, tmp_path)
    names = [c["name"] for c in cluster.containers()]
    assert names == ["doctor", "train"]
    seen: dict[tuple[int, str], tuple[str, str]] = {}
    for pod in cluster.pods:
        node = tmp_path / f"node-{pod.index}"
        shutil.copytree(NODE_FIXTURE, node)  # the healthy p5 node this pod landed on
        for container in cluster.containers():
            env = cluster.env(pod, container)
            env["RESCTL_DOCTOR_STORAGE_TEST_MB"] = "4"  # the fixture tree is a temp dir, not FSx
            # What is asserted is the resolution, not the probes' speed: a loaded CI box once kept the memory
            # probe's thread past its 10 s budget (a FAIL "did not finish within 10s").
            env["RESCTL_DOCTOR_TIMEOUT"] = "300s"
            in_pod(cluster, pod, env)
            argv = cluster.argv(pod, container)
            if argv[0] == "doctor":
                report = doctor(argv, node)
                checks = {(p["name"], c["name"]): c for p in report["probes"] for c in p["checks"]}
                rdzv = checks[("dns", "rendezvous")]
                assert checks[("grace", "order")]["status"] == "PASS"
                assert checks[("gpu", "count")]["status"] == "PASS"
                # the doctor does not print the node count: resolve its profile as it did, in its environment
                resolved = resolve(argv[argv.index("-p") + 1]).profile
                assert rdzv["status"] == "PASS"  # it would FAIL if this index were not below launch.nnodes
                seen[(pod.index, "doctor")] = (resolved.launch.nnodes, f"{rdzv['expected']}:{resolved.launch.rdzv_port}")
            else:
                seen[(pod.index, container["name"])] = dry_run(argv)
    expected = (str(nodes), f"{cluster.store_fqdn}:29500")  # every pod a client of the store's Service
    assert set(seen.values()) == {expected}, seen
    assert len(seen) == 2 * nodes


@pytest.mark.parametrize("nodes", SIZES)
def test_doctor_of_a_pod_past_the_node_count_fails(nodes: int, tmp_path: Path, in_pod: Any) -> None:
    """What the issue found at index 1: a profile whose node count is not the Job's fails the doctor."""
    cluster = Cluster(nodes, tmp_path)
    pod = Pod(nodes, f"{cluster.name}-{nodes}", f"{cluster.name}-{nodes}.x", cluster.pods[0].root)
    doctor_container = cluster.spec["initContainers"][0]
    env = {**cluster.env(pod, doctor_container), "RESCTL_DOCTOR_DNS_WAIT": "0s"}
    in_pod(cluster, pod, env)
    argv = cluster.argv(pod, doctor_container)
    result = CliRunner().invoke(app, [*argv, "--root", str(NODE_FIXTURE), "--only", "dns", "--json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 1
    assert f"JOB_COMPLETION_INDEX={nodes} but launch.nnodes = {nodes}" in doc["probes"][0]["checks"][0]["message"]


@pytest.mark.parametrize("nodes", SIZES)
def test_every_slurm_node_resolves_the_allocation(nodes: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = REPO / "examples" / "profiles" / "slurm-p5.toml"
    script = REPO / "examples" / "train_ckpt.py"
    nodelist = f"p5-[001-{nodes:03d}]" if nodes > 1 else "p5-001"
    seen = set()
    for node_id in range(nodes):
        for name in list(os.environ):
            if name.startswith(("SLURM_", "RESCTL_")):
                monkeypatch.delenv(name)
        for name, value in {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": nodelist, "SLURM_JOB_NUM_NODES": str(nodes),
                            "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_STEP_ID": "1",
                            "SLURM_NODEID": str(node_id), "SLURM_LOCALID": "0", "SLURM_PROCID": str(node_id)}.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(socket, "gethostname", lambda n=node_id: f"p5-{n + 1:03d}")
        monkeypatch.chdir(tmp_path)
        nnodes, endpoint = dry_run(["run", "-p", str(profile), str(script)])
        seen.add((nnodes, endpoint))
    assert seen == {(str(nodes), "localhost:0" if nodes == 1 else "p5-001:29500")}


def test_doctor_at_index_1_waits_for_the_store_to_be_published(tmp_path: Path, in_pod: Any) -> None:
    """Pod 1 starts before the rendezvous store's Service has an address: its doctor waits (doctor.dns_wait
    from the ConfigMap) instead of failing once, and passes when the name appears."""
    import threading

    cluster = Cluster(2, tmp_path)
    _, pod1 = cluster.pods
    address = cluster.dns.pop(cluster.store_fqdn)
    publish = threading.Timer(1.5, lambda: cluster.dns.__setitem__(cluster.store_fqdn, address))
    node = tmp_path / "node-1"
    shutil.copytree(NODE_FIXTURE, node)
    doctor_container = cluster.spec["initContainers"][0]
    in_pod(cluster, pod1, cluster.env(pod1, doctor_container))
    publish.start()
    try:
        report = doctor([*cluster.argv(pod1, doctor_container), "--only", "dns,grace"], node)
    finally:
        publish.cancel()
    rdzv = next(c for p in report["probes"] for c in p["checks"] if c["name"] == "rendezvous")
    assert rdzv["status"] == "PASS" and "after" in rdzv["message"] and rdzv["measured"] == address


def _apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The API server's JSON patch (RFC 6902) for the ops resctl sends: test and add."""
    import copy

    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for p in parents:
            target = target.setdefault(p, {})
        if op["op"] == "test":
            assert target.get(last) == op["value"], "the node changed since it was read: the patch is refused"
        else:
            target[last] = op["value"]
    return out


def _schedulable(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    """The scheduler's two filters that matter here: required node affinity, and NoSchedule taints."""
    labels = node["metadata"].get("labels") or {}
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]

    def matches(expr: dict[str, Any]) -> bool:
        have = labels.get(expr["key"])
        return have not in expr["values"] if expr["operator"] == "NotIn" else have in expr["values"]

    if not any(all(matches(e) for e in term["matchExpressions"]) for term in terms):
        return False
    tolerated = [t for t in pod.get("tolerations", [])]
    for taint in node["spec"].get("taints") or []:
        if taint["effect"] == "NoSchedule" and not any(
                t["key"] == taint["key"] and (t.get("operator") == "Exists" or t.get("value") == taint.get("value"))
                for t in tolerated):
            return False
    return True


def test_a_node_kept_out_is_labelled_tainted_and_avoided_by_the_next_pod(tmp_path: Path) -> None:
    """health.keep_out on Kubernetes: the patch resctl sends to a bad node, applied as the API server would,
    keeps the kit's next pod off it; a healthy node (or the same node before) still takes the pod. The pod
    runs as the ServiceAccount the kit's ClusterRole lets get and patch nodes."""
    from resctl.health.placement import LABEL, TAINT, node_patch

    cluster = Cluster(2, tmp_path)
    pod = cluster.spec
    node = {"metadata": {"name": "ip-10-1-0-7", "resourceVersion": "42",
                         "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}}
    assert _schedulable(pod, node)
    bad = _apply_json_patch(node, node_patch(node, "preflight: slow: links 0.02 GB/s vs the others' 0.2"))
    assert bad["metadata"]["labels"][LABEL] == "bad"
    assert bad["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5.48xlarge", "other labels kept"
    assert {t["key"] for t in bad["spec"]["taints"]} == {"nvidia.com/gpu", TAINT}, "other taints kept"
    assert not _schedulable(pod, bad)
    without_label = {**bad, "metadata": {**bad["metadata"], "labels": {}}}
    assert not _schedulable(pod, without_label), "the taint alone keeps the pod off too"
    with pytest.raises(AssertionError, match="changed since"):
        _apply_json_patch({**node, "metadata": {**node["metadata"], "resourceVersion": "43"}}, node_patch(node, "x"))
    # Its ServiceAccount may do it: the kit's ClusterRole, bound to the pod's ServiceAccount.
    from tests.unit.test_deploy_kit import render

    sa, role, binding = render("health-rbac.yaml", NODES="2")
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == binding["subjects"][0]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert {"get", "patch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == ["nodes"]
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
