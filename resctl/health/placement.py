"""Health -> placement: a node found bad is kept out of the next placement (opt-in, `health.keep_out`).

A node the cluster preflight named slow or broken, or one whose workers faulted `health.node_fault_limit`
times in this job, is recorded in `<run_dir>/bad-nodes.jsonl` and, by scheduler:

- Slurm: drained, `scontrol update nodename=N state=drain reason="resctl: ..."` (Slurm allocates no drained
  node), and the job requeued (it needs `--requeue`) so it starts again on nodes without it. A requeue ends
  every step of the job at once, the one asking for it included, so under examples/slurm/train.sbatch
  (which sets `RESCTL_SLURM_REQUEUE_FILE`) resctl only writes what the requeue should change and the batch
  script, polling for it while the step runs, requeues: `scontrol requeuehold`, `scontrol update jobid=J NumNodes=K
  NumTasks=K` when the job should start again on the K good nodes (launch.nnodes' range allows it; Slurm
  otherwise keeps the node count and waits for a node to replace the drained one), `scontrol release`.
  Elsewhere resctl runs `scontrol requeue JOBID` itself (the node count kept). Slurm holds a requeued job
  for its credential lifetime (AuthInfo cred_expire, 120 s by default) before it starts again. Draining
  needs Slurm operator rights (root, SlurmUser, or AdminLevel=Operator); without them the scontrol error
  is reported and the job goes on as it would have.
- Kubernetes: the node is labelled `resctl.io/health=bad` and tainted `resctl.io/unhealthy=<reason
  slug>:NoSchedule` through the API server with the pod's service account (the kit's ClusterRole grants
  get/patch on nodes). The kit's pod template requires `resctl.io/health NotIn (bad)` and tolerates no
  such taint, so the Job's next pod lands elsewhere. The node name comes from `NODE_NAME` (the kit sets
  it from the downward API's spec.nodeName). Undo: `kubectl label node N resctl.io/health-` and
  `kubectl taint node N resctl.io/unhealthy-`.

The command and patch builders are pure (golden-tested); `keep_out` runs them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resctl.profile import contract

LABEL = "resctl.io/health"
TAINT = "resctl.io/unhealthy"
RECORD = "bad-nodes.jsonl"
REQUEUE_FILE_ENV = contract.SLURM_REQUEUE_FILE  # set by examples/slurm/train.sbatch: it requeues the job itself
SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class BadNode:
    host: str  # the node's name for its scheduler (Slurm node name, Kubernetes node name)
    reason: str  # one line, with the measured numbers


def scheduler(env: Mapping[str, str], mode: str) -> str | None:
    """slurm, kubernetes or None (keep_out off, or "auto" finding neither)."""
    if mode in ("slurm", "kubernetes"):
        return mode
    if mode != "auto":
        return None
    if "SLURM_JOB_ID" in env:
        return "slurm"
    if "KUBERNETES_SERVICE_HOST" in env:
        return "kubernetes"
    return None


def node_name(env: Mapping[str, str]) -> str:
    """This node's name for its scheduler: SLURMD_NODENAME (Slurm), NODE_NAME (the kit's downward API), else
    the host name."""
    return env.get("SLURMD_NODENAME") or env.get("NODE_NAME") or socket.gethostname()


def drain_argv(node: BadNode) -> list[str]:
    reason = "resctl: " + re.sub(r"\s+", " ", node.reason)[:180]
    return ["scontrol", "update", f"nodename={node.host}", "state=drain", f"reason={reason}"]


def requeue_argv(job_id: str) -> list[str]:
    return ["scontrol", "requeue", job_id]


def requeue_updates(nodes: int | None) -> list[str]:
    """The `scontrol update` fields of a requeued job that should start again on `nodes` nodes (one task, one
    resctl, per node); none to keep its node count. Slurm keeps a requeued job's last node count, a range
    of `sbatch -N` included, so without them it waits for as many nodes as it had."""
    return [] if nodes is None else [f"NumNodes={nodes}", f"NumTasks={nodes}"]


def taint_value(reason: str) -> str:
    """A label-value-safe slug of the reason (<= 63 characters of [A-Za-z0-9._-])."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", reason).strip("-._")[:63].strip("-._")
    return slug or "bad"


def node_patch(node: Mapping[str, Any], reason: str) -> list[dict[str, Any]]:
    """A JSON patch of a Node object: the label, and the taint added to (or replacing ours in) its taints;
    a `test` of the resourceVersion makes a concurrent change fail instead of being overwritten."""
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("key") != TAINT]
    taints.append({"key": TAINT, "value": taint_value(reason), "effect": "NoSchedule"})
    labels = "/metadata/labels" if node.get("metadata", {}).get("labels") is not None else None
    ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                  "value": node.get("metadata", {}).get("resourceVersion", "")}]
    if labels:
        ops.append({"op": "add", "path": f"{labels}/{LABEL.replace('/', '~1')}", "value": "bad"})
    else:
        ops.append({"op": "add", "path": "/metadata/labels", "value": {LABEL: "bad"}})
    ops.append({"op": "add", "path": "/spec/taints", "value": taints})
    return ops


def record(run_dir: Path | None, node: BadNode, action: str) -> None:
    if run_dir is None:
        return
    line = json.dumps({"t": time.time(), "host": node.host, "reason": node.reason, "action": action}) + "\n"
    try:
        with open(run_dir / RECORD, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError:
        pass


def keep_out(node: BadNode, where: str, env: Mapping[str, str] = os.environ,
             run_dir: Path | None = None) -> str:
    """Keep `node` out of the next placement on `where` (slurm, kubernetes); one line saying what was done."""
    try:
        if where == "slurm":
            done = _run(drain_argv(node))
            said = f"drained Slurm node {node.host} ({done})"
        else:
            _patch_node(node, env)
            said = f"labelled {LABEL}=bad and tainted {TAINT}:NoSchedule Kubernetes node {node.host}"
    except (OSError, RuntimeError, ValueError) as err:
        said = f"could not keep node {node.host} out on {where}: {err}"
    record(run_dir, node, said)
    return said


def requeue(env: Mapping[str, str] = os.environ, nodes: int | None = None) -> str:
    """Requeue this Slurm job (on `nodes` nodes; None: as many as now); one line saying what was done."""
    job = env.get("SLURM_JOB_ID")
    if not job:
        return "no SLURM_JOB_ID: not requeued"
    on = f" on {nodes} node(s)" if nodes is not None else ""
    asked, note = env.get(REQUEUE_FILE_ENV), ""
    if asked:
        try:
            _write_request(Path(asked), requeue_updates(nodes))
            return f"Slurm job {job} to be requeued{on} by the batch script (asked through {REQUEUE_FILE_ENV})"
        except OSError as err:
            note = f"; could not ask the batch script through {asked} ({err})"
    try:
        done = _run(requeue_argv(job))
    except (OSError, RuntimeError) as err:
        return f"could not requeue Slurm job {job}: {err}{note}"
    if nodes is not None:
        note += f"; its node count is kept, not {nodes} (examples/slurm/train.sbatch requeues on fewer)"
    return f"requeued Slurm job {job} ({done}){note}"


def _write_request(path: Path, updates: list[str]) -> None:
    """One line of `scontrol update` fields (possibly empty), written aside and renamed: the batch script
    reads it whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(" ".join(updates) + "\n", encoding="ascii")
    os.replace(tmp, path)


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv[:3])} ...` exited {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip()[:300]}")
    return "ok"


def _patch_node(node: BadNode, env: Mapping[str, str]) -> None:
    base = f"https://{env['KUBERNETES_SERVICE_HOST']}:{env.get('KUBERNETES_SERVICE_PORT', '443')}"
    token = (SA / "token").read_text(encoding="ascii").strip()
    ctx = ssl.create_default_context(cafile=str(SA / "ca.crt"))
    url = f"{base}/api/v1/nodes/{node.host}"
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=ctx, timeout=10) as resp:
        current = json.loads(resp.read())
    body = json.dumps(node_patch(current, node.reason)).encode()
    req = urllib.request.Request(url, data=body, method="PATCH",
                                 headers={**headers, "Content-Type": "application/json-patch+json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10):
            pass
    except urllib.error.HTTPError as err:
        raise RuntimeError(f"PATCH {url}: HTTP {err.code} {err.read()[:200]!r}") from None
