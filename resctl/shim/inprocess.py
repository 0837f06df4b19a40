"""Run the user's script inside NVRx `inprocess.Wrapper`: after a fault in any rank, every
healthy rank re-runs the script from the top in the same interpreter.

Stores and ports. ft_launcher gives each cycle a fresh free `MASTER_PORT` on the rank-0 node.
The shim hosts one application TCPStore there (rank 0) for the whole process; the wrapper's own
store binds an OS-chosen port on rank 0, published through the application store, so it can
collide neither with the launcher's rendezvous port nor with another job on the host. The
script's `init_process_group()` (env://, no store) is given `PrefixStore("resctl/<cycle>/<iteration>",
app_store)`: a fresh process group per restart iteration, without the script knowing.
"""

from __future__ import annotations

import datetime
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from resctl.shim.runtime import Shim, Target

PORT_KEY = "resctl/wrapper_store_port"


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def app_store() -> Any:
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    return dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
        is_master=rank == 0, timeout=datetime.timedelta(seconds=300), wait_for_workers=False,
    )


def wrapper_store_factory() -> type:
    from nvidia_resiliency_ext import inprocess

    class PublishedPortStore(inprocess.store.TCPStore):  # type: ignore[misc, name-defined]
        """The wrapper's store on a free port that rank 0 chooses and publishes."""

        def __init__(self, app: Any, **kwargs: Any) -> None:
            if int(os.environ["RANK"]) == self.TCP_STORE_HOST_RANK:
                super().__init__(port=0, **kwargs)
                app.set(PORT_KEY, str(self.port))
            else:
                super().__init__(port=int(app.get(PORT_KEY)), **kwargs)

    return PublishedPortStore


def build_wrapper(shim: "Shim", app: Any) -> Any:
    from nvidia_resiliency_ext import inprocess

    cfg = shim.profile.inprocess
    health = None
    if cfg.health_check:
        import torch

        checks = []
        if torch.cuda.is_available():
            checks.append(inprocess.health_check.CudaHealthCheck(timeout=_seconds(min(30.0, cfg.soft_timeout))))
        if cfg.max_rank_faults is not None:
            checks.append(inprocess.health_check.FaultCounter(max_rank_faults=cfg.max_rank_faults))
        health = inprocess.Compose(*checks) if len(checks) > 1 else (checks[0] if checks else None)
    elif cfg.max_rank_faults is not None:
        health = inprocess.health_check.FaultCounter(max_rank_faults=cfg.max_rank_faults)
    logfile = None
    if shim.run_dir is not None:
        logfile = str((shim.run_dir / "logs" / "inprocess-monitor-rank{rank}.log").absolute())
        os.makedirs(os.path.dirname(logfile), exist_ok=True)
    return inprocess.Wrapper(
        store_factory=wrapper_store_factory(),
        store_kwargs={"app": app, "timeout": _seconds(cfg.barrier_timeout)},
        initialize=inprocess.initialize.RetryController(
            max_iterations=cfg.max_iterations, min_world_size=cfg.min_world_size,
        ),
        health_check=health,
        monitor_thread_interval=_seconds(cfg.monitor_interval),
        monitor_process_interval=_seconds(cfg.monitor_interval),
        heartbeat_interval=_seconds(cfg.monitor_interval),
        progress_watchdog_interval=_seconds(cfg.progress_interval),
        soft_timeout=_seconds(cfg.soft_timeout),
        hard_timeout=_seconds(cfg.hard_timeout),
        heartbeat_timeout=_seconds(cfg.heartbeat_timeout),
        barrier_timeout=_seconds(cfg.barrier_timeout),
        completion_timeout=_seconds(cfg.completion_timeout),
        last_call_wait=_seconds(cfg.last_call_wait),
        termination_grace_time=_seconds(cfg.termination_grace_time),
        monitor_process_logfile=logfile,
    )


def run_wrapped(shim: "Shim", target: "Target") -> None:
    import torch.distributed as dist
    from nvidia_resiliency_ext import inprocess

    app = app_store()
    wrapper = build_wrapper(shim, app)
    patched_init = dist.init_process_group
    state: dict[str, Any] = {"iteration": 0}

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        # A script's plain init_process_group() gets this iteration's fresh store.
        if kwargs.get("store") is None and kwargs.get("init_method") in (None, "env://"):
            kwargs.pop("init_method", None)
            kwargs["store"] = dist.PrefixStore(f"resctl/{shim.cycle}/{state['iteration']}", app)
            kwargs.setdefault("rank", int(os.environ["RANK"]))
            kwargs.setdefault("world_size", int(os.environ["WORLD_SIZE"]))
        return patched_init(*args, **kwargs)

    dist.init_process_group = init_process_group

    def iteration(call_wrapper: Any) -> None:
        state["iteration"] = call_wrapper.iteration
        shim.events.iteration = call_wrapper.iteration
        if call_wrapper.iteration > 0:
            shim.events.emit("restart", layer="inprocess", step=shim.step)
            if shim.checkpointer is not None:
                shim.checkpointer.reset_after_fault()
        try:
            shim.run_target(target)
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        except BaseException as err:
            shim.events.emit("fault", cause="exception", injected=type(err).__name__ == "InjectedFault",
                             step=shim.step, error=f"{type(err).__name__}: {err}")
            raise

    # NVRx passes the CallWrapper to a parameter annotated with its class (a real class, not a string).
    iteration.__annotations__ = {"call_wrapper": inprocess.CallWrapper, "return": None}
    wrapper(iteration)()
