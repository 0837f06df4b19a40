"""`python -m resctl.launch.ft_entry ARGS`: NVRx `ft_launcher` with version adapters applied.

resctl starts the launcher through this module instead of `-m nvidia_resiliency_ext...launcher` so
that small incompatibilities between an NVRx release and the installed torch can be bridged without
forking NVRx. Each adapter checks for the exact gap it fills and does nothing otherwise:

- NVRx 0.4.1's multiprocessing compat reads `ProcessExitedException.pid`; torch >= 2.6 names it
  `error_pid`. Without the alias a worker killed by a signal under `--start-method fork`
  (`launch.worker_start = "fork"`) crashes the launcher instead of restarting the workers.
"""

from __future__ import annotations


def apply_adapters() -> list[str]:
    """Patch what the installed versions need; returns the names of the adapters applied."""
    import importlib

    applied = []
    # `torch.multiprocessing.spawn` the attribute is a function; the module has to be looked up.
    spawn = importlib.import_module("torch.multiprocessing.spawn")
    if not hasattr(spawn.ProcessException, "pid"):
        spawn.ProcessException.pid = property(lambda self: self.error_pid)  # type: ignore[attr-defined]
        applied.append("ProcessException.pid")
    try:  # NVRx 0.4/0.5 carry their own copy of torch elastic; 0.6+ use torch's
        from nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat.agent.server import api
    except ImportError:
        return applied
    if not getattr(api.RunResult.is_failed, "_resctl", False):
        original = api.RunResult.is_failed

        def is_failed(self: "api.RunResult") -> bool:
            return original(self) or (self.state == api.WorkerState.UNHEALTHY and bool(self.failures))

        is_failed._resctl = True  # type: ignore[attr-defined]
        api.RunResult.is_failed = is_failed  # type: ignore[method-assign]
        applied.append("RunResult.is_failed")
    return applied


# Imported once in the launcher when workers are forked from it, so no worker pays for them again.
# torch imports torch._dynamo (and sympy) lazily on the first optimizer it builds: seconds per worker.
PRELOAD = ("torch", "torch.distributed", "torch.optim", "torch.nn", "torch._dynamo", "torch.distributed.fsdp",
           "resctl.shim.runtime", "resctl.checkpoint", "nvidia_resiliency_ext.fault_tolerance.rank_monitor_client")


def preload() -> None:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)


def main() -> None:
    import os

    apply_adapters()
    from resctl.launch.launcher_logs import install  # issue 12: no secrets or stop tracebacks in its log

    install()
    if os.environ.get("RESCTL_PRELOAD") == "1":
        preload()
    from nvidia_resiliency_ext.fault_tolerance.launcher import main as launcher_main

    launcher_main()


if __name__ == "__main__":
    main()
