"""The Kubernetes and Slurm kits: manifests render, validate against the Kubernetes schemas, and
carry a profile resctl accepts."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from string import Template

import pytest
import yaml

from resctl.profile.load import resolve

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "examples" / "kubernetes"
MANIFESTS = ["headless-service.yaml", "fsx-storage.yaml", "profile-configmap.yaml", "job.yaml"]


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


@pytest.mark.parametrize("name", MANIFESTS)
@pytest.mark.parametrize("nodes,gpus", [("2", "8"), ("16", "4")])
def test_manifests_validate_against_kubernetes_schemas(name: str, nodes: str, gpus: str) -> None:
    import kubernetes_validate

    for doc in render(name, NODES=nodes, GPUS_PER_NODE=gpus):
        kubernetes_validate.validate(doc, "1.33", strict=True)


def test_job_is_wired_the_way_resctl_expects() -> None:
    (job,) = render("job.yaml", NODES="4")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == 4 and spec["parallelism"] == 4
    pod = spec["template"]["spec"]
    (service,) = render("headless-service.yaml")
    assert pod["subdomain"] == service["metadata"]["name"] and service["spec"]["clusterIP"] == "None"
    assert pod["initContainers"][0]["command"][:2] == ["resctl", "doctor"]
    train = pod["containers"][0]
    assert train["command"][:2] == ["resctl", "run"] and "--metrics-port" in train["command"]
    assert "IPC_LOCK" in train["securityContext"]["capabilities"]["add"]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert pod["terminationGracePeriodSeconds"] > 90, "longer than checkpoint.sigterm_grace"
    env = {e["name"]: e for e in train["env"]}
    assert env["RESCTL_LAUNCH_NNODES"]["value"] == "4" and "JOB_UID" in env
    annotations = spec["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"


def test_configmap_profile_is_valid(tmp_path: Path) -> None:
    (cm,) = render("profile-configmap.yaml")
    path = tmp_path / "prod.toml"
    path.write_text(cm["data"]["prod.toml"])
    (service,) = render("headless-service.yaml")
    profile = resolve(path, env={}).profile
    assert profile.launch.k8s_service == service["metadata"]["name"]
    assert profile.checkpoint.dir.startswith("/fsx/") and profile.launch.run_dir.startswith("/fsx/")
    assert profile.heartbeat.timeout == 900 and profile.heartbeat.initial_timeout == 1200


def test_nothing_points_at_a_real_account_or_bucket() -> None:
    for path in [*KIT.iterdir(), *(REPO / "examples" / "slurm").iterdir()]:
        text = path.read_text()
        assert not re.search(r"\b\d{12}\b", text), f"{path.name}: looks like an AWS account id"
        assert "s3://" not in text and "arn:aws" not in text, path.name


def test_sbatch_script_parses() -> None:
    script = REPO / "examples" / "slurm" / "train.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    directives = [line for line in script.read_text().splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --requeue" in directives and "#SBATCH --ntasks-per-node=1" in directives
