"""Where a job's rendezvous is: explicit settings, Kubernetes, PyTorchJob, Slurm, else standalone.

`detect` is pure: it reads only the `Launch` section, the environment and hostname it is given,
and files under ``root`` (the pod's service-account namespace and ``/etc/resolv.conf``), so every
scheduler can be tested from fixture environments. Rules, first match wins:

1. **explicit** -- ``launch.standalone = true``, ``launch.rdzv_endpoint = HOST:PORT`` or
   ``launch.master_addr`` (torchrun's static-rendezvous address, used as the c10d endpoint).
2. **kubernetes-indexed-job** -- ``JOB_COMPLETION_INDEX`` is set. The pod's hostname is
   ``<job>-<index>``; rank 0 is ``<job>-0.<launch.k8s_service>.<namespace>.svc.<domain>``
   (namespace: ``launch.k8s_namespace``, else ``POD_NAMESPACE``, else the service-account file;
   domain: from the ``search`` line of ``/etc/resolv.conf``, else ``cluster.local``).
3. **pytorchjob** -- Kubeflow's ``PET_RDZV_ENDPOINT`` (elastic) or ``MASTER_ADDR`` with ``RANK`` /
   ``PET_NODE_RANK``.
4. **slurm** -- ``SLURM_JOB_ID``: rank 0 is the first host of the step's (else the job's) nodelist.
5. **standalone** -- a single node: ``localhost:0`` (``127.0.0.1:PORT`` with ``--master-port``), as torchrun.

Standalone uses port 0 on purpose. ft_launcher's own ``--standalone`` does the same
(``localhost:0`` plus a fresh uuid4 run id): the c10d TCPStore binds port 0 when it starts, so
two jobs on one host never collide, and there is no window between choosing a free port and
binding it, as there would be if resctl bound port 0, closed it and passed the number on. resctl
passes ``--rdzv-endpoint localhost:0 --rdzv-id <run_id>`` itself instead of ``--standalone``
because ``--standalone`` replaces the run id with one resctl never sees.

The run id names the rendezvous and resctl's run directory. It must be the same on every node
and across restarts of a pod or node within one job (so a restarted node rejoins the job and the
run directory keeps one history), and differ between two jobs that reuse a name. So it comes
from the scheduler's job identity, never from a pod, process or time: the Job name plus its uid
(``JOB_UID``, exposed through the downward API) on Kubernetes, ``PET_RDZV_ID`` or the PyTorchJob
name on Kubeflow, ``SLURM_JOB_ID`` (kept by ``scontrol requeue``) on Slurm. A standalone run gets
a fresh id; ``launch.rdzv_id`` overrides all of these.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import product
from pathlib import Path

from resctl.errors import UsageError
from resctl.profile.schema import Endpoint, Launch, NodeRange, nnodes_range, split_endpoint

__all__ = ["Rendezvous", "detect", "expand_hostlist", "first_host", "fresh_run_id"]

STANDALONE_ENDPOINT = "localhost:0"  # torchrun's own single-node default (its workers' MASTER_ADDR)
SA_NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
UID_ENV = "JOB_UID"
JOB_NAME_ENV = "JOB_NAME"

_UID_HINT = (
    "expose the Job's uid as JOB_UID (env valueFrom fieldRef "
    "metadata.labels['batch.kubernetes.io/controller-uid']) so two Jobs of the same name get different run ids"
)


@dataclass(frozen=True)
class Rendezvous:
    """Where and under which id the nodes of one job meet.

    Attributes:
        endpoint: "host:port" of the c10d store; "localhost:0" when standalone (the store picks
            a free port as it binds).
        run_id: unique per job, the same on every node and across pod/node restarts of the job;
            never "none".
        standalone: single node, store on this host.
        node_rank: this node's rank where the scheduler or profile says it; None leaves it to the
            rendezvous (ft_launcher's c10d rendezvous assigns group ranks itself either way).
        nnodes: node count the scheduler reports ("4" or "2:4"); None keeps the profile's.
        is_host: for ``--rdzv-conf is_host=1|0`` where the scheduler tells which node hosts the
            store; None lets ft_launcher compare the endpoint with its own hostname.
        source: "explicit", "kubernetes-indexed-job", "pytorchjob", "slurm" or "standalone".
        notes: human lines explaining the choice (printed by ``resctl run --dry-run``).
    """

    endpoint: str
    run_id: str
    standalone: bool
    node_rank: int | None
    nnodes: str | None
    is_host: bool | None
    source: str
    notes: tuple[str, ...]

    def address(self, default_port: int = 0) -> Endpoint:
        """`endpoint` parsed (it is always "host:port" or "[v6]:port"; `default_port` for a bare host)."""
        return split_endpoint(self.endpoint, default_port)

    def node_range(self, launch: Launch) -> NodeRange:
        """The job's nodes as (MIN, MAX): the scheduler's count, else the profile's launch.nnodes."""
        return nnodes_range(self.nnodes) if self.nnodes else launch.node_range


def fresh_run_id() -> str:
    """A new run id for a job no scheduler names: ``<UTC time>-<8 hex>``, sortable and unique."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def detect(
    launch: Launch,
    env: Mapping[str, str],
    hostname: str,
    *,
    root: Path = Path("/"),
    new_id: Callable[[], str] = fresh_run_id,
) -> Rendezvous:
    """Find this job's rendezvous (see the module docstring for the rules).

    Args:
        launch: the profile's ``[launch]`` section.
        env: the launcher's environment (pass ``os.environ``; tests pass fixtures).
        hostname: this node's hostname (``socket.gethostname()``).
        root: filesystem root for the files read on Kubernetes.
        new_id: makes the run id of a job no scheduler names.

    Raises:
        UsageError: impossible or ambiguous settings; the message says which key to set.
    """
    if launch.standalone or launch.rdzv_endpoint.strip().lower() != "auto" or launch.master_addr:
        return _explicit(launch, env, hostname, new_id)
    if "JOB_COMPLETION_INDEX" in env:
        return _indexed_job(launch, env, hostname, root)
    if "PET_RDZV_ENDPOINT" in env or ("MASTER_ADDR" in env and ("RANK" in env or "PET_NODE_RANK" in env)):
        return _pytorchjob(launch, env, hostname)
    if "SLURM_JOB_ID" in env:
        return _slurm(launch, env)
    return _standalone(launch, new_id, "standalone", ("no scheduler found: single-node standalone run",))


# --- explicit and standalone ------------------------------------------------------------------


def _explicit(launch: Launch, env: Mapping[str, str], hostname: str, new_id: Callable[[], str]) -> Rendezvous:
    # The schema has already refused conflicting settings (standalone with an endpoint, two hosts, port 0
    # across nodes): `profile validate` and `run` share those rules.
    if launch.standalone:
        return _standalone(launch, new_id, "standalone", ("launch.standalone = true",))
    if launch.endpoint is not None:
        host, port = launch.endpoint
        why = f"launch.rdzv_endpoint = {launch.rdzv_endpoint}"
    else:
        # The rendezvous store is the workers' store too (launch.adapters._agent_store), as under
        # torchrun: the master port is both.
        host, port = launch.master_addr, launch.master_port or launch.rdzv_port
        why = f"launch.master_addr = {launch.master_addr}, port {port}" + (
            " (launch.master_port: the workers' MASTER_PORT, as under torchrun)" if launch.master_port else "")
    endpoint = _join_endpoint(host, port)
    notes = [f"explicit endpoint {endpoint} ({why})"]
    if "JOB_COMPLETION_INDEX" in env:  # an Indexed Job's pods reaching a store of their own (launch.store)
        _check_index(launch, _int_env(env, "JOB_COMPLETION_INDEX"))
    run_id = _profile_run_id(launch)
    if run_id:
        notes.append(f"run id {run_id!r} from launch.rdzv_id")
    else:
        derived = _scheduler_run_id(env, hostname)
        if derived:
            run_id, how = derived
            notes.append(f"run id {run_id!r} from {how}")
        elif launch.node_range.max == 1:
            run_id = new_id()
            notes.append(f"run id {run_id!r}: fresh (single node)")
        else:
            raise UsageError(
                f"launch.nnodes = {launch.nnodes} with an explicit endpoint needs a run id shared by every node: "
                "set launch.rdzv_id (e.g. the job's name and submission time), the same on all nodes"
            )
    return Rendezvous(endpoint, run_id, False, launch.node_rank, None, None, "explicit", tuple(notes))


def _standalone(launch: Launch, new_id: Callable[[], str], source: str, why: tuple[str, ...]) -> Rendezvous:
    if launch.node_range.max > 1:
        raise UsageError(
            f"launch.nnodes = {launch.nnodes} but no rendezvous was found for more than one node: "
            "set launch.rdzv_endpoint = HOST:PORT and launch.rdzv_id (the same on every node), "
            "or run under a Kubernetes Indexed Job, a PyTorchJob or Slurm"
        )
    run_id = _profile_run_id(launch) or new_id()
    endpoint = STANDALONE_ENDPOINT
    where = f"endpoint {endpoint}: the store binds a free port itself, so jobs on one host do not collide"
    if launch.master_port:  # the workers' MASTER_PORT, as under torchrun (launch.adapters._agent_store)
        endpoint = _join_endpoint("127.0.0.1", launch.master_port)
        where = f"endpoint {endpoint} (launch.master_port: the workers' MASTER_PORT, as under torchrun)"
    notes = (*why, where, f"run id {run_id!r}" + (" from launch.rdzv_id" if _profile_run_id(launch) else ": fresh"))
    return Rendezvous(endpoint, run_id, True, 0, None, True, source, notes)


# --- Kubernetes Indexed Job -------------------------------------------------------------------


def _indexed_job(launch: Launch, env: Mapping[str, str], hostname: str, root: Path) -> Rendezvous:
    index = _int_env(env, "JOB_COMPLETION_INDEX")
    job = _k8s_job_name(env, hostname, index)
    if job is None:
        raise UsageError(
            f"Kubernetes Indexed Job (JOB_COMPLETION_INDEX={index}) but the hostname {hostname!r} is not "
            f"<job>-{index}: set env JOB_NAME from metadata.labels['batch.kubernetes.io/job-name'], "
            "or set launch.rdzv_endpoint"
        )
    if not launch.k8s_service:
        raise UsageError(
            f"Kubernetes Indexed Job {job!r}: set launch.k8s_service to the headless Service of the Job "
            f"(the pods' spec.subdomain), so every pod can reach rank 0 at {job}-0.<service>"
        )
    namespace, ns_from = _k8s_namespace(launch, env, root)
    domain = _cluster_domain(root, namespace)
    endpoint = f"{job}-0.{launch.k8s_service}.{namespace}.svc.{domain}:{launch.rdzv_port}"

    notes = [
        f"Kubernetes Indexed Job {job!r}, completion index {index} (this pod is node {index})",
        f"rank 0 at {endpoint} (Service launch.k8s_service, namespace from {ns_from})",
    ]
    _check_index(launch, index)
    if launch.nnodes == "1":
        notes.append("launch.nnodes = 1: set it to the Job's completions if this Job has more than one pod")

    run_id = _profile_run_id(launch)
    if run_id:
        notes.append(f"run id {run_id!r} from launch.rdzv_id")
    else:
        run_id, how = _k8s_run_id(env, job)
        notes.append(f"run id {run_id!r} from {how}; it stays the same when a pod restarts")
        if UID_ENV not in env:
            notes.append(_UID_HINT)
    node_rank = launch.node_rank if launch.node_rank is not None else index
    return Rendezvous(endpoint, run_id, False, node_rank, None, index == 0, "kubernetes-indexed-job", tuple(notes))


def _check_index(launch: Launch, index: int) -> None:
    """An Indexed Job's pod at `index` is one of launch.nnodes nodes."""
    if index >= launch.node_range.max:
        raise UsageError(
            f"JOB_COMPLETION_INDEX={index} but launch.nnodes = {launch.nnodes}: "
            "set launch.nnodes to the Job's completions (= parallelism)"
        )


def _k8s_job_name(env: Mapping[str, str], hostname: str, index: int) -> str | None:
    if env.get(JOB_NAME_ENV):
        return env[JOB_NAME_ENV]
    short = hostname.split(".")[0]
    # Indexed Job pods are named <job>-<index>-<suffix> and have hostname <job>-<index>.
    match = re.fullmatch(rf"(.+)-{index}(?:-[a-z0-9]{{5}})?", short)
    return match.group(1) if match else None


def _k8s_namespace(launch: Launch, env: Mapping[str, str], root: Path) -> tuple[str, str]:
    if launch.k8s_namespace:
        return launch.k8s_namespace, "launch.k8s_namespace"
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"], "POD_NAMESPACE"
    path = root / SA_NAMESPACE_FILE
    try:
        namespace = path.read_text().strip()
    except OSError:
        namespace = ""
    if namespace:
        return namespace, f"/{SA_NAMESPACE_FILE}"
    raise UsageError(
        "cannot tell the pod's namespace: set launch.k8s_namespace, or env POD_NAMESPACE from metadata.namespace"
    )


def _cluster_domain(root: Path, namespace: str) -> str:
    # The pod's resolv.conf search list starts with "<namespace>.svc.<cluster domain>".
    try:
        text = (root / "etc/resolv.conf").read_text()
    except OSError:
        return "cluster.local"
    prefix = f"{namespace}.svc."
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "search":
            for entry in fields[1:]:
                if entry.startswith(prefix) and len(entry) > len(prefix):
                    return entry[len(prefix) :].rstrip(".")
    return "cluster.local"


def _k8s_run_id(env: Mapping[str, str], job: str) -> tuple[str, str]:
    uid = env.get(UID_ENV, "").strip()
    if uid:
        return _clean_id(f"{job}-{uid.replace('-', '')[:8]}"), f"the Job name and {UID_ENV}"
    return _clean_id(job), "the Job name"


# --- Kubeflow PyTorchJob ----------------------------------------------------------------------


def _pytorchjob(launch: Launch, env: Mapping[str, str], hostname: str) -> Rendezvous:
    elastic = "PET_RDZV_ENDPOINT" in env
    notes: list[str] = []
    if elastic:
        host, port = _split_endpoint(env["PET_RDZV_ENDPOINT"], launch.rdzv_port, "PET_RDZV_ENDPOINT")
        node_rank: int | None = None
        is_host: bool | None = None
        nnodes = env.get("PET_NNODES") or None
        notes.append(f"elastic PyTorchJob: rendezvous at PET_RDZV_ENDPOINT={env['PET_RDZV_ENDPOINT']}")
    else:
        host = env["MASTER_ADDR"]
        port = _int_env(env, "MASTER_PORT") if "MASTER_PORT" in env else launch.rdzv_port
        rank_var = "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK"
        node_rank = _int_env(env, rank_var)
        is_host = node_rank == 0
        # Newer operators set WORLD_SIZE = replicas x nprocPerNode and PET_NNODES = replicas.
        nnodes = env.get("PET_NNODES") or env.get("WORLD_SIZE") or None
        notes.append(f"PyTorchJob: master {host}:{port}, node rank {node_rank} from {rank_var}")
        if nnodes is not None:
            notes.append(f"{nnodes} nodes from {'PET_NNODES' if env.get('PET_NNODES') else 'WORLD_SIZE'}")
    endpoint = _join_endpoint(host, port)
    if launch.node_rank is not None:
        node_rank = launch.node_rank
    nnodes = _reconcile_nnodes(launch, nnodes, notes)

    run_id = _profile_run_id(launch)
    if run_id:
        notes.append(f"run id {run_id!r} from launch.rdzv_id")
    elif env.get("PET_RDZV_ID"):
        run_id = _clean_id(env["PET_RDZV_ID"])
        notes.append(f"run id {run_id!r} from PET_RDZV_ID")
    else:
        job = _pytorchjob_name(host, hostname)
        run_id, how = _k8s_run_id(env, job)
        how = how.replace("the Job name", f"the PyTorchJob name {job!r}")
        notes.append(f"run id {run_id!r} from {how}; it stays the same when a pod restarts")
        if UID_ENV not in env:
            notes.append(
                f"set {UID_ENV} (or launch.rdzv_id) to a value unique per submission so two PyTorchJobs "
                "of the same name get different run ids"
            )
    return Rendezvous(endpoint, run_id, False, node_rank, nnodes, is_host, "pytorchjob", tuple(notes))


def _pytorchjob_name(master_host: str, hostname: str) -> str:
    # Replica pods and services are named <job>-<master|worker>-<index>.
    for name in (master_host.split(".")[0], hostname.split(".")[0]):
        match = re.fullmatch(r"(.+)-(?:master|worker)-\d+", name)
        if match:
            return match.group(1)
    return master_host.split(".")[0]


# --- Slurm ------------------------------------------------------------------------------------


def _slurm(launch: Launch, env: Mapping[str, str]) -> Rendezvous:
    job_id = env["SLURM_JOB_ID"]
    if _int_env(env, "SLURM_LOCALID", 0) > 0:
        raise UsageError(
            "resctl starts every worker of a node itself; run one resctl per node "
            "(srun --ntasks-per-node=1), not one per GPU"
        )
    nodelist_var = next((v for v in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST") if env.get(v)), "")
    count_var = next((v for v in ("SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") if env.get(v)), "")
    nodes = _int_env(env, count_var) if count_var else 1
    node_id = _int_env(env, "SLURM_NODEID", 0)
    run_id = _profile_run_id(launch) or _clean_id(f"slurm-{job_id}")
    id_note = f"run id {run_id!r}" + (
        " from launch.rdzv_id" if _profile_run_id(launch) else " from SLURM_JOB_ID; a requeued job keeps it"
    )
    notes = [f"Slurm job {job_id}: {nodes} node(s) from {count_var or 'default'}, this is node {node_id} (SLURM_NODEID)"]

    if nodes == 1:
        # One node: no host needs to reach this one, and a shared node may run several jobs.
        _reconcile_nnodes(launch, "1", notes)
        capped = _slurm_cap(launch, 1, None, notes)
        notes += [f"endpoint {STANDALONE_ENDPOINT}: single node, the store binds a free port itself", id_note]
        return Rendezvous(STANDALONE_ENDPOINT, run_id, True, 0, capped, True, "slurm", tuple(notes))

    if not nodelist_var:
        raise UsageError(f"Slurm job {job_id} on {nodes} nodes but SLURM_JOB_NODELIST is not set; set launch.rdzv_endpoint")
    try:
        host = first_host(env[nodelist_var])
    except ValueError as err:
        raise UsageError(f"cannot read {nodelist_var}={env[nodelist_var]!r}: {err}; set launch.rdzv_endpoint") from None
    endpoint = _join_endpoint(host, launch.rdzv_port)
    notes.append(f"rank 0 at {endpoint}: first host of {nodelist_var}")
    if "SLURM_STEP_ID" not in env:
        notes.append("not inside an srun step: start resctl with srun --ntasks-per-node=1 so every node runs it")
    notes.append(id_note)
    node_rank = launch.node_rank if launch.node_rank is not None else node_id
    nnodes = _slurm_cap(launch, nodes, _reconcile_nnodes(launch, str(nodes), notes), notes)
    return Rendezvous(endpoint, run_id, False, node_rank, nnodes, node_id == 0, "slurm", tuple(notes))


def _slurm_cap(launch: Launch, nodes: int, nnodes: str | None, notes: list[str]) -> str | None:
    """A node range's maximum capped at the allocation: no node outside it comes, and the launcher's first
    rendezvous would wait its last-call timeout for one (a job requeued on fewer nodes, a range wider than
    `sbatch -N`)."""
    if nnodes is not None:
        return nnodes
    lo, hi = launch.node_range
    if hi <= nodes:
        return None
    capped = f"{lo}:{nodes}" if lo < nodes else str(nodes)
    notes.append(f"launch.nnodes = {launch.nnodes} capped at the allocation's {nodes} node(s): {capped}")
    return capped


_HOST_PART = re.compile(r"\[([^\[\]]*)\]")


def _split_top_level(nodelist: str) -> Iterator[str]:
    depth, start = 0, 0
    for i, ch in enumerate(nodelist):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif ch == "," and depth == 0:
            yield nodelist[start:i]
            start = i + 1
    if depth != 0:
        raise ValueError("'[' without ']'")
    yield nodelist[start:]


def _expand_ranges(spec: str) -> list[str]:
    out: list[str] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            raise ValueError("empty range")
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {item!r}")
        if not sep:
            out.append(lo)
            continue
        if int(hi) < int(lo):
            raise ValueError(f"range {item!r} runs backwards")
        # Slurm pads to the width of the lower bound: [08-10] -> 08 09 10.
        out.extend(str(n).zfill(len(lo)) for n in range(int(lo), int(hi) + 1))
    return out


def _expand_one(pattern: str) -> Iterator[str]:
    pieces = _HOST_PART.split(pattern)  # literal, ranges, literal, ranges, ..., literal
    literals, ranges = pieces[0::2], [_expand_ranges(spec) for spec in pieces[1::2]]
    if any("[" in lit or "]" in lit for lit in literals):
        raise ValueError(f"nested brackets in {pattern!r}")
    for combo in product(*ranges):
        yield literals[0] + "".join(num + lit for num, lit in zip(combo, literals[1:]))


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand a Slurm hostlist: ``"p5-[001-003,007],gpu9"`` -> ``["p5-001", "p5-002", "p5-003", "p5-007", "gpu9"]``.

    Handles several bracket groups per name (``"r[1-2]n[01-02]"``, expanded in order) and keeps
    the zero-padding of each range's lower bound. Raises ValueError on malformed input.
    """
    return [host for part in _split_top_level(nodelist.strip()) if part.strip() for host in _expand_one(part.strip())]


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist (node 0 of the job), without expanding the rest."""
    for part in _split_top_level(nodelist.strip()):
        if part.strip():
            return next(_expand_one(part.strip()))
    raise ValueError("empty nodelist")


# --- helpers ----------------------------------------------------------------------------------


def _profile_run_id(launch: Launch) -> str:
    value = launch.rdzv_id.strip()
    # torchrun's default "none" would make every job share one id.
    return "" if value.lower() in {"auto", "none", ""} else value


def _scheduler_run_id(env: Mapping[str, str], hostname: str) -> tuple[str, str] | None:
    """The scheduler's job identity, for an explicit endpoint with ``launch.rdzv_id = auto``."""
    if "JOB_COMPLETION_INDEX" in env:
        try:
            job = _k8s_job_name(env, hostname, _int_env(env, "JOB_COMPLETION_INDEX"))
        except UsageError:
            job = None
        if job:
            return _k8s_run_id(env, job)
    if env.get("PET_RDZV_ID"):
        return _clean_id(env["PET_RDZV_ID"]), "PET_RDZV_ID"
    if env.get("MASTER_ADDR") and ("RANK" in env or "PET_NODE_RANK" in env):
        return _k8s_run_id(env, _pytorchjob_name(env["MASTER_ADDR"], hostname))
    if env.get("SLURM_JOB_ID"):
        return _clean_id(f"slurm-{env['SLURM_JOB_ID']}"), "SLURM_JOB_ID"
    return None


def _clean_id(value: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", value).strip("-.")
    if not cleaned or cleaned.lower() == "none":
        raise UsageError(f"cannot make a run id from {value!r}; set launch.rdzv_id")
    return cleaned


def _int_env(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise UsageError(f"environment variable {name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"environment variable {name}={raw!r} is not an integer") from None
    if value < 0:
        raise UsageError(f"environment variable {name}={raw!r} is negative")
    return value


def _nnodes_range(nnodes: str) -> tuple[int, int]:
    try:
        return nnodes_range(nnodes)
    except ValueError as err:
        raise UsageError(f"launch.nnodes = {nnodes!r}: {err}") from None


def _reconcile_nnodes(launch: Launch, detected: str | None, notes: list[str]) -> str | None:
    """The scheduler's count wins over the default "1"; a profile value it contradicts is an error."""
    if detected is None:
        return None
    det_lo, det_hi = _nnodes_range(detected)
    if launch.nnodes == "1" or launch.nnodes == detected:
        return detected
    lo, hi = launch.node_range
    if lo <= det_lo and det_hi <= hi:
        notes.append(f"launch.nnodes = {launch.nnodes} kept (the scheduler reports {detected})")
        return None
    raise UsageError(
        f"launch.nnodes = {launch.nnodes} but the scheduler reports {detected} nodes: "
        "remove launch.nnodes or make it match"
    )


def _split_endpoint(value: str, default_port: int, what: str) -> tuple[str, int]:
    try:
        return split_endpoint(value, default_port)
    except ValueError as err:
        raise UsageError(f"{what} = {value!r}: {err}") from None


def _join_endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
