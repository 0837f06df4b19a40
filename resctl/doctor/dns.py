"""DNS probe: can this node resolve the rendezvous host, and its own name?

The rendezvous is found as `resctl run` finds it (explicit endpoint, Kubernetes Indexed Job,
PyTorchJob, Slurm, else standalone). On Kubernetes the rank-0 pod's name resolves only once the
headless Service publishes it, which is the usual reason a multi-node job never starts.

The rendezvous host is looked up again, with growing pauses, until it resolves or
``doctor.dns_wait`` has passed (a pod at index 1 often starts before pod 0 has an address).

Verdicts:
  rendezvous  FAIL the rendezvous host does not resolve within doctor.dns_wait, or the settings are inconsistent;
              PASS standalone (nothing to resolve).
  hostname    WARN this node's FQDN does not resolve (torch's default local address).
"""

from __future__ import annotations

import socket
import time

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Status
from resctl.errors import ResctlError
from resctl.launch.rendezvous import detect


def _resolve(host: str) -> list[str]:
    return sorted({str(info[4][0]) for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)})


def _resolve_waiting(host: str, ctx: Context) -> tuple[list[str], float]:
    """Addresses of `host` and the seconds waited for them; retries until doctor.dns_wait has passed.

    Raises:
        OSError: the last lookup's error, once the wait is over (or the probe's deadline cancelled it).
    """
    t0 = time.monotonic()
    deadline, pause = t0 + ctx.profile.doctor.dns_wait, 0.5
    while True:
        try:
            return _resolve(host), time.monotonic() - t0
        except OSError:
            if time.monotonic() + pause > deadline:
                raise
            if ctx.cancel.wait(pause):
                raise
            pause = min(pause * 2, 5.0)


def run(ctx: Context) -> list[Check]:
    hostname = socket.gethostname()
    checks = []
    try:
        rdzv = detect(ctx.profile.launch, ctx.env, hostname, root=ctx.root, new_id=lambda: "doctor")
    except ResctlError as err:
        checks.append(Check("rendezvous", Status.FAIL, f"rendezvous settings: {err}", None, None, "",
                            "fix the [launch] rendezvous keys (resctl run --dry-run shows the plan)"))
        rdzv = None
    if rdzv is not None and rdzv.standalone:
        checks.append(Check("rendezvous", Status.PASS, "standalone: store on this host", rdzv.endpoint, None))
    elif rdzv is not None:
        host = rdzv.endpoint.rsplit(":", 1)[0].strip("[]")
        try:
            addrs, waited = _resolve_waiting(host, ctx)
            after = f", after {waited:.0f}s" if waited >= 1 else ""
            checks.append(Check("rendezvous", Status.PASS, f"{host} -> {', '.join(addrs[:3])} ({rdzv.source}{after})",
                                addrs[0], host))
        except OSError as err:
            fix = ("create the headless Service named in launch.k8s_service with publishNotReadyAddresses: true"
                   if rdzv.source == "kubernetes-indexed-job" else "check the host name and the pod's DNS config")
            within = f" within doctor.dns_wait = {ctx.profile.doctor.dns_wait:g}s" if ctx.profile.doctor.dns_wait else ""
            checks.append(Check("rendezvous", Status.FAIL, f"cannot resolve {host}{within} ({rdzv.source}): {err}", None,
                                host, "", fix))
    fqdn = socket.getfqdn(hostname)
    try:
        addrs = _resolve(fqdn)
        checks.append(Check("hostname", Status.PASS, f"{fqdn} -> {', '.join(addrs[:3])}", addrs[0], fqdn))
    except OSError as err:
        checks.append(Check("hostname", Status.WARN, f"this node's name {fqdn} does not resolve: {err}", None, fqdn,
                            "", "set launch.local_addr to an address other nodes reach"))
    return checks
