"""The Kubernetes and Slurm kits: manifests render, validate against the Kubernetes schemas, spend
failures per index, nest their grace periods, and carry profiles resctl accepts.
(tests/unit/test_cluster_simulation.py runs the containers' commands; tests/integration/test_slurm_kit.py
runs the sbatch file on a real Slurm.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from string import Template

import pytest
import yaml

from resctl.profile import grace
from resctl.profile.load import resolve

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "examples" / "kubernetes"
SLURM = REPO / "examples" / "slurm"
PROFILES = REPO / "examples" / "profiles"
MANIFESTS = ["headless-service.yaml", "fsx-storage.yaml", "profile-configmap.yaml", "job.yaml", "health-rbac.yaml",
             "rendezvous-store.yaml"]
DCGM_EXPORTER_PORT = 9400


def values(**override: str) -> dict[str, str]:
    out = {}
    for line in (KIT / "values.env").read_text().splitlines():
        m = re.match(r"export (\w+)=\$\{\w+:-(.*)\}$", line)
        if m:
            out[m.group(1)] = m.group(2)
    out.update(override)
    return out


def render(name: str, **override: str) -> list[dict]:
    text = Template((KIT / name).read_text()).substitute(values(**override))
    assert "${" not in text
    return [doc for doc in yaml.safe_load_all(text) if doc]


def pod_spec(**override: str) -> dict:
    (job,) = render("job.yaml", **override)
    return job["spec"]["template"]["spec"]


def configmap_profile(tmp_path: Path, **override: str):  # type: ignore[no-untyped-def]
    (cm,) = render("profile-configmap.yaml", **override)
    path = tmp_path / "prod.toml"
    path.write_text(cm["data"]["prod.toml"])
    return resolve(path, env={}).profile


@pytest.mark.parametrize("name", MANIFESTS)
@pytest.mark.parametrize("nodes,gpus", [("1", "8"), ("2", "8"), ("4", "8"), ("16", "4")])
def test_manifests_validate_against_kubernetes_schemas(name: str, nodes: str, gpus: str) -> None:
    import kubernetes_validate

    for doc in render(name, NODES=nodes, GPUS_PER_NODE=gpus):
        kubernetes_validate.validate(doc, "1.33", strict=True)


def test_every_kit_file_is_rendered_by_the_readme() -> None:
    readme = (KIT / "README.md").read_text()
    for name in [*MANIFESTS, "podmonitor.yaml"]:
        assert name in readme, name


def test_job_is_wired_the_way_resctl_expects() -> None:
    (job,) = render("job.yaml", NODES="4")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 4 and spec["parallelism"] == 4
    pod = spec["template"]["spec"]
    (service,) = render("headless-service.yaml")
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert pod["initContainers"][0]["command"][:2] == ["resctl", "doctor"]
    train = pod["containers"][0]
    assert train["command"][:2] == ["resctl", "run"] and "--metrics-port" in train["command"]
    assert "IPC_LOCK" in train["securityContext"]["capabilities"]["add"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    # one environment and one set of mounts for every container: no container resolves other launch settings
    doctor = pod["initContainers"][0]
    assert doctor["env"] == train["env"] and doctor["volumeMounts"] == train["volumeMounts"]
    assert not [e for e in train["env"] if e["name"].startswith("RESCTL_LAUNCH_")], "launch settings live in the profile"
    assert "JOB_UID" in {e["name"] for e in train["env"]}


def test_store_deployment_serves_what_the_nodes_connect_to(tmp_path: Path) -> None:
    """rendezvous-store.yaml: one `resctl store` (never two), off the GPU nodes, behind a Service whose port
    is the store's; the kit's profile points every node at that Service as a client (the kit's default)."""
    deployment, service = render("rendezvous-store.yaml", JOB_NAME="j")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"] == ["resctl", "store", "--listen", "0.0.0.0:29500"]
    assert service["spec"]["selector"] == spec["template"]["metadata"]["labels"]
    assert service["spec"]["ports"][0]["port"] == 29500 and service["metadata"]["name"] == "j-store"
    launch = configmap_profile(tmp_path, JOB_NAME="j").launch
    assert launch.store == "external" and launch.rdzv_endpoint == "j-store.default.svc.cluster.local:29500"
    assert launch.endpoint is not None and launch.endpoint[1] == service["spec"]["ports"][0]["port"]


def test_failures_are_spent_per_index() -> None:
    (job,) = render("job.yaml", BACKOFF_LIMIT_PER_INDEX="5")
    spec = job["spec"]
    assert spec["backoffLimitPerIndex"] == 5 and spec["maxFailedIndexes"] == 0 and "backoffLimit" not in spec
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # required by podFailurePolicy
    rules = spec["podFailurePolicy"]["rules"]
    ignore = [r for r in rules if r["action"] == "Ignore"]
    assert ignore and ignore[0]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert rules.index(ignore[0]) == 0, "a disruption is ignored before any exit code is looked at"
    fail = [r for r in rules if r["action"] == "FailJob"]
    assert fail[0]["onExitCodes"] == {"operator": "In", "values": [2]}, "exit 2 (bad profile/usage) fails fast"
    assert spec["ttlSecondsAfterFinished"] > 0


def test_placement_and_short_node_loss_tolerations() -> None:
    pod = pod_spec(INSTANCE_TYPE="p5e.48xlarge", AVAILABILITY_ZONE="us-east-2b")
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5e.48xlarge",
                                   "topology.kubernetes.io/zone": "us-east-2b"}
    loss = {t["key"]: t for t in pod["tolerations"] if t.get("effect") == "NoExecute"}
    assert set(loss) == {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
    assert all(t["tolerationSeconds"] < 300 for t in loss.values()), "shorter than the 300 s default"


def test_grace_periods_nest(tmp_path: Path) -> None:
    profile = configmap_profile(tmp_path)
    pod = pod_spec()
    assert grace.problems(profile, "configmap", float(pod["terminationGracePeriodSeconds"])) == []
    assert profile.checkpoint.save_on_sigterm
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env[grace.GRACE_ENV] == str(pod["terminationGracePeriodSeconds"]), "the doctor sees the pod's grace"
    # a pod grace shorter than the launcher's term timeout is caught
    short = pod_spec(TERMINATION_GRACE_SECONDS="100")["terminationGracePeriodSeconds"]
    assert [p.key for p in grace.problems(profile, "configmap", float(short))] == ["launch.term_timeout"]


def test_metrics_port_and_podmonitor() -> None:
    pod = pod_spec()
    train = pod["containers"][0]
    port = int(train["command"][train["command"].index("--metrics-port") + 1])
    assert port != DCGM_EXPORTER_PORT
    assert {"name": "metrics", "containerPort": port} in train["ports"]
    (monitor,) = render("podmonitor.yaml")
    assert monitor["kind"] == "PodMonitor" and monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (job,) = render("job.yaml")
    # the Job controller labels its pods batch.kubernetes.io/job-name=<job>
    assert monitor["spec"]["selector"]["matchLabels"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert [e["port"] for e in monitor["spec"]["podMetricsEndpoints"]] == ["metrics"]
    assert "prometheus.io/scrape" not in str(job), "Prometheus Operator ignores the annotations"
    (service,) = render("headless-service.yaml")
    assert {"name": "metrics", "port": port, "targetPort": "metrics"} in service["spec"]["ports"]


def test_configmap_profile_is_valid(tmp_path: Path) -> None:
    profile = configmap_profile(tmp_path, NODES="4", GPUS_PER_NODE="4")
    (service,) = render("headless-service.yaml")
    assert profile.launch.k8s_service == service["metadata"]["name"]
    assert profile.launch.nnodes == "4" and profile.launch.nproc_per_node == "4"
    assert profile.checkpoint.dir.startswith("/fsx/") and profile.launch.run_dir.startswith("/fsx/")
    assert profile.heartbeat.timeout == 900 and profile.heartbeat.initial_timeout == 1200
    assert profile.doctor.dns_wait >= 60, "pods at index > 0 wait for pod 0's DNS name"


def test_image_follows_the_aws_recipe() -> None:
    text = (KIT / "Dockerfile").read_text()
    assert re.search(r"^ARG NVRX_VERSION=\d+\.\d+\.\d+$", text, re.M), "NVRx pinned"
    assert '"nvidia-resiliency-ext==${NVRX_VERSION}"' in text
    assert "rm -rf /opt/hpcx/ompi /usr/local/mpi /opt/hpcx/nccl_rdma_sharp_plugin" in text
    assert "libibverbs1" in text and "apt-get remove" in text
    assert "-c /tmp/keep-torch.txt" in text, "the base image's CUDA torch is kept"
    ignore = (REPO / ".dockerignore").read_text().split()
    assert {".venv", ".git", "tests"} <= set(ignore)
    assert "README.md" not in ignore and "resctl" not in ignore and "pyproject.toml" not in ignore


def test_no_rdmav_fork_safe_anywhere() -> None:
    for path in [*KIT.iterdir(), *PROFILES.iterdir(), *SLURM.iterdir()]:
        assert not re.search(r"RDMAV_FORK_SAFE\s*=\s*\"?1", path.read_text()), path.name


def test_nothing_points_at_a_real_account_or_bucket() -> None:
    for path in [*KIT.iterdir(), *SLURM.iterdir(), *PROFILES.iterdir()]:
        text = path.read_text()
        assert not re.search(r"\b\d{12}\b", text), f"{path.name}: looks like an AWS account id"
        assert "s3://" not in text and "arn:aws" not in text, path.name


def test_sbatch_script_parses_and_saves_before_it_requeues() -> None:
    script = SLURM / "train.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    text = script.read_text()
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --requeue" in directives and "#SBATCH --ntasks-per-node=1" in directives
    assert any(re.fullmatch(r"#SBATCH --signal=B:USR1@\d+", d) for d in directives), "warning to the batch shell only"
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert 'scancel --signal=TERM "$SLURM_JOB_ID"' in code, "TERM goes to the steps through slurmd"
    assert not re.search(r"kill\s+-(TERM|15)\b", code), "srun answers SIGTERM by SIGKILLing the step"


@pytest.mark.parametrize("name", ["slurm-p5.toml", "eks-p5.toml"])
def test_cluster_profiles_take_the_node_count_from_the_scheduler(name: str) -> None:
    raw = tomllib.loads((PROFILES / name).read_text())
    assert "nnodes" not in raw["launch"]
    assert "RDMAV_FORK_SAFE" not in raw["launch"].get("env", {})
