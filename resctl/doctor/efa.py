"""EFA / InfiniBand probe: RDMA devices under /sys/class/infiniband, their port state, the
/dev/infiniband/uverbs* nodes the pod needs, `fi_info -p efa`, and the libfabric environment.

Verdicts:
  devices   FAIL fewer devices than doctor.efa_devices (32 on p5.48xlarge); SKIP none present
            and none expected.
  ports     FAIL a port not ACTIVE (the device is there, the link is down).
  uverbs    FAIL fewer /dev/infiniband/uverbs* than devices (the pod did not get the devices:
            request vpc.amazonaws.com/efa, or mount /dev/infiniband).
  fi_info   FAIL `fi_info -p efa` finds no EFA provider; SKIP when libfabric is not installed.
  env       (EFA only) FAIL FI_PROVIDER set to another provider; WARN FI_PROVIDER unset, or
            neither FI_EFA_FORK_SAFE nor RDMAV_FORK_SAFE = 1 (dataloader workers fork after
            memory registration).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Skip, Status

CLASS = "/sys/class/infiniband"


def _is_efa(ctx: Context, dev: str) -> bool:
    driver = ctx.path(f"{CLASS}/{dev}/device/driver")
    try:
        if os.path.basename(os.readlink(driver)) == "efa":
            return True
    except OSError:
        pass
    return dev.startswith(("rdmap", "efa"))


def run(ctx: Context) -> list[Check]:
    base = ctx.path(CLASS)
    devices = sorted(p.name for p in base.iterdir()) if base.is_dir() else []
    want = ctx.expect.efa_devices
    if not devices and not want:
        raise Skip("no EFA/InfiniBand devices (none expected)")
    checks: list[Check] = []
    n = len(devices)
    if want is not None and n < want:
        checks.append(Check("devices", Status.FAIL, f"{n} of {want} EFA/IB devices", n, want, "devices",
                            "request all vpc.amazonaws.com/efa devices in the pod spec; check the EFA driver "
                            "(lsmod | grep efa) and the instance's network cards"))
    else:
        checks.append(Check("devices", Status.PASS, f"{n} devices ({devices[0]} ...)" if n else "none", n, want,
                            "devices"))
    if not devices:
        return checks
    down = []
    for dev in devices:
        ports = ctx.path(f"{CLASS}/{dev}/ports")
        for port in sorted(ports.iterdir()) if ports.is_dir() else []:
            state = (ctx.read(f"{CLASS}/{dev}/ports/{port.name}/state") or "?").strip()
            if "ACTIVE" not in state:
                down.append(f"{dev}/{port.name} ({state.split(':')[-1].strip()})")
    if down:
        checks.append(Check("ports", Status.FAIL, f"{len(down)} port(s) not ACTIVE: {', '.join(down[:6])}",
                            n - len(down), n, "active", "the link is down: check the ENI/EFA attachment and "
                            "`ibv_devinfo`; replace the node if it stays down"))
    else:
        checks.append(Check("ports", Status.PASS, f"all {n} ports ACTIVE", n, n, "active"))
    dev_dir = ctx.path("/dev/infiniband")
    uverbs = sorted(p.name for p in dev_dir.glob("uverbs*")) if dev_dir.is_dir() else []
    if len(uverbs) < n:
        checks.append(Check("uverbs", Status.FAIL, f"{len(uverbs)} /dev/infiniband/uverbs* for {n} devices",
                            len(uverbs), n, "nodes", "the container lacks the RDMA device nodes: request "
                            "vpc.amazonaws.com/efa resources (EFA device plugin) or mount /dev/infiniband"))
    else:
        checks.append(Check("uverbs", Status.PASS, f"{len(uverbs)} uverbs device nodes", len(uverbs), n, "nodes"))
    efa = [d for d in devices if _is_efa(ctx, d)]
    if efa:
        checks.append(_fi_info(ctx))
        checks.append(_env(ctx))
    return checks


def _fi_info(ctx: Context) -> Check:
    exe = shutil.which("fi_info", path=ctx.env.get("PATH", os.defpath)) if ctx.live else None
    if exe is None:
        return Check("fi_info", Status.SKIP, "fi_info (libfabric) not installed" if ctx.live
                     else "not run on a snapshot root")
    try:
        out = subprocess.run([exe, "-p", "efa", "-t", "FI_EP_RDM"], capture_output=True, text=True,
                             timeout=max(1.0, ctx.expect.timeout_s - 1), env=dict(ctx.env))
    except subprocess.TimeoutExpired:
        return Check("fi_info", Status.FAIL, "fi_info -p efa hung", None, "efa", "", "check the EFA driver (dmesg)")
    if out.returncode == 0 and "provider: efa" in out.stdout:
        return Check("fi_info", Status.PASS, "libfabric finds the efa provider", "efa", "efa")
    why = (out.stderr or out.stdout).strip().splitlines()[-1:] or [f"exit {out.returncode}"]
    return Check("fi_info", Status.FAIL, f"fi_info -p efa: {why[0]}", None, "efa", "",
                 "install the EFA software (aws-efa-installer) in the image and use its libfabric")


def _env(ctx: Context) -> Check:
    provider = ctx.env.get("FI_PROVIDER")
    if provider and provider != "efa":
        return Check("env", Status.FAIL, f"FI_PROVIDER={provider} on an EFA node", provider, "efa", "",
                     'set FI_PROVIDER=efa (launch.env) or unset it')
    missing = []
    if not provider:
        missing.append("FI_PROVIDER=efa")
    if ctx.env.get("FI_EFA_FORK_SAFE") != "1" and ctx.env.get("RDMAV_FORK_SAFE") != "1":
        missing.append("FI_EFA_FORK_SAFE=1")
    if missing:
        return Check("env", Status.WARN, f"not set: {', '.join(missing)}", provider, "efa", "",
                     "add to the profile's [launch.env]: " + ", ".join(f'{m.split("=")[0]} = "{m.split("=")[1]}"'
                                                                      for m in missing))
    return Check("env", Status.PASS, "FI_PROVIDER=efa, fork-safe", "efa", "efa")
