"""Environment probe: NCCL / torch / NVRx settings that break recovery or speed. Reads the
environment the workers will get (this process's, overlaid with the profile's launch.env).

Verdicts:
  nvls          FAIL in-process restart on and NCCL_NVLS_ENABLE set to anything but 0 (unset, the
                plan sets 0 for the workers, and that passes): NVLink SHARP
                multicast objects are not released when a communicator is aborted, so the restarted
                iteration hangs or fails to create its communicator.
  async-errors  WARN TORCH_NCCL_ASYNC_ERROR_HANDLING=0: a timed-out collective then never raises,
                so neither restart layer sees the fault until the heartbeat timeout.
  transports    WARN NCCL_P2P_DISABLE / NCCL_SHM_DISABLE / NCCL_IB_DISABLE / NCCL_NET=Socket
                forced on: training runs, slowly.
  visible       WARN CUDA_VISIBLE_DEVICES lists fewer GPUs than doctor.gpus.
"""

from __future__ import annotations

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Status


def run(ctx: Context) -> list[Check]:
    env = ctx.env
    checks = []
    nvls = env.get("NCCL_NVLS_ENABLE")
    if ctx.expect.inprocess:
        if nvls != "0":
            # the plan sets 0 unless the launcher's environment or [launch.env] sets it: so it was set
            checks.append(Check("nvls", Status.FAIL, f"in-process restart with NCCL_NVLS_ENABLE={nvls}", nvls, "0",
                                "", 'set NCCL_NVLS_ENABLE = "0" in [launch.env] or unset it (resctl then sets 0)'))
        else:
            by = "set by resctl for the workers" if "NCCL_NVLS_ENABLE" in ctx.planned_env else "in-process restart on"
            checks.append(Check("nvls", Status.PASS, f"NCCL_NVLS_ENABLE=0 ({by})", nvls, "0"))
    else:
        checks.append(Check("nvls", Status.PASS, "in-process restart off: NVLS allowed", nvls, None))
    aeh = env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
    if aeh == "0":
        checks.append(Check("async-errors", Status.WARN, "TORCH_NCCL_ASYNC_ERROR_HANDLING=0: collective timeouts "
                            "never raise", aeh, "1 or unset", "", "unset it (ft_launcher sets 1)"))
    else:
        checks.append(Check("async-errors", Status.PASS, f"TORCH_NCCL_ASYNC_ERROR_HANDLING={aeh}" if aeh else
                            "TORCH_NCCL_ASYNC_ERROR_HANDLING unset (ft_launcher sets 1)",
                            aeh, "1 or unset"))
    forced = [f"{k}={env[k]}" for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE")
              if env.get(k) == "1"]
    if env.get("NCCL_NET", "").lower() == "socket":
        forced.append(f"NCCL_NET={env['NCCL_NET']}")
    if forced:
        checks.append(Check("transports", Status.WARN, f"fast NCCL transports disabled: {', '.join(forced)}",
                            ", ".join(forced), "unset", "", "remove these unless debugging a transport"))
    else:
        checks.append(Check("transports", Status.PASS, "no NCCL transport disabled", None, None))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and ctx.expect.gpus:
        n = len([v for v in visible.split(",") if v.strip()])
        if n < ctx.expect.gpus:
            checks.append(Check("visible", Status.WARN, f"CUDA_VISIBLE_DEVICES={visible} hides GPUs", n,
                                ctx.expect.gpus, "GPUs", "unset CUDA_VISIBLE_DEVICES or lower doctor.gpus"))
    return checks
