"""Run the user's script inside NVRx `inprocess.Wrapper`: after a fault in any rank, every
healthy rank re-runs the script from the top in the same interpreter.

Stores and ports. The workers' `MASTER_ADDR:MASTER_PORT` is the launcher's rendezvous store, as
under torchrun (`resctl.launch.adapters._agent_store`); the shim keeps one *application* client of
it for the whole process (rank 0 hosts it only where a launcher gives workers a port of their own).
The wrapper's own store is hosted by rank 0: it picks a free port (bind to port 0) on an address
of its own node and publishes both through the application store, so it collides neither with the
rendezvous port nor with another job on the host. The port is passed to the wrapper as a plain number in `store_kwargs`, because
NVRx *forks* a monitor process per rank that builds its own store from the same kwargs (rank 0's
monitor tries to host, finds the port taken by its parent and connects as a client — NVRx's
design). A store object in the kwargs would be shared across the fork; a factory that chose the
port itself would pick a second one in the monitor.

Process groups. The script's plain `init_process_group()` (env://, no store) is given
`PrefixStore("resctl/<cycle>/<iteration>", app_store)`: a fresh process group per restart
iteration, without the script knowing.

Aborting gloo. NVRx's `AbortTorchDistributed` aborts NCCL communicators and destroys the
process groups, but a gloo collective blocked in a peer's recv is not woken by either (nor by
`ProcessGroupGloo.abort()`): on CPU a healthy rank waiting for the faulted one would sit until the
gloo timeout or NVRx's hard timeout kills it. `AbortGloo` records the connected TCP sockets each
`init_process_group`/`new_group` creates and `shutdown()`s them; the blocked collective then fails
at once ("Connection closed by peer"), the main thread returns to Python and the wrapper's
asynchronous RankShouldRestart is delivered. Listening sockets are left alone (gloo's listener
thread aborts the process if its socket is shut down under it).

Progress. The shim pings the wrapper's progress watchdog on every optimizer step (and from the
checkpoint heartbeat). That starts NVRx's *manual* progress timestamp, so a rank that stops making
optimizer steps is caught by `soft_timeout` even when its main thread keeps running Python (a
loop of short sleeps, a retry loop) — which the automatic timestamp (a `Py_AddPendingCall`
callback) alone would take for progress. See docs/recovery.md.
"""

from __future__ import annotations

import datetime
import importlib
import logging
import os
import socket
from pathlib import Path
from typing import Any, Callable, Protocol

from resctl import console
from resctl.launch.preload import LATE_PRELOAD
from resctl.patching import Patches
from resctl.profile.schema import Profile
from resctl.shim.agent_store import round_prefix, uses_agent_store
from resctl.shim.fresh import FreshState
from resctl.shim.target import Target, run_target
from resctl.telemetry.events import EventLog
from resctl.telemetry.goodput import PEER_ERROR

log = logging.getLogger("resctl.shim")


class RestartHost(Protocol):
    """What the wrapper needs of the worker's shim (`resctl.shim.runtime.Shim` provides it)."""

    profile: Profile
    run_dir: Path | None
    cycle: int
    step: int
    world_size: int
    events: EventLog
    patches: Patches

    def set_progress(self, ping: Callable[[], None] | None) -> None: ...

    def settle_checkpoint(self) -> None: ...

PORT_KEY = "resctl/wrapper_store/{cycle}"


def _seconds(value: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=value)


def app_store() -> Any:
    """The shim's client of the workers' store on MASTER_ADDR:MASTER_PORT, kept for the whole process
    (rank 0 hosts it when the launcher's store is not the workers')."""
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    agent_store = uses_agent_store()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]),
        is_master=rank == 0 and not agent_store, timeout=datetime.timedelta(seconds=300), wait_for_workers=False,
    )
    return dist.PrefixStore(round_prefix(), store) if agent_store else store  # this round's keys only


def free_endpoint(host: str) -> tuple[str, int]:
    """(address, port) where this process can host a store now: `host` when it is an address of this
    node (MASTER_ADDR on the rendezvous host), else this node's name; the OS picks a free port and
    the wrapper binds it moments later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, 0))
        except OSError:  # the rendezvous runs on another node, or the name is not a local address
            s.bind(("", 0))
            host = socket.getfqdn()
        return host, int(s.getsockname()[1])


def wrapper_store_endpoint(app: Any, rank: int, cycle: int) -> tuple[str, int]:
    """Rank 0 chooses where the wrapper's store is and publishes it; the others read it."""
    key = PORT_KEY.format(cycle=cycle)
    if rank == 0:
        host, port = free_endpoint(os.environ.get("MASTER_ADDR", ""))
        app.set(key, f"{host} {port}")
        return host, port
    host, port = app.get(key).decode().rsplit(" ", 1)
    return host, int(port)


def _socket_inodes() -> dict[int, str]:
    """fd -> 'socket:[inode]' for this process's sockets (Linux /proc; empty elsewhere)."""
    out: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


class GlooSockets:
    """The TCP connections created by process-group constructors, so an abort can cut them."""

    def __init__(self, served_ports: frozenset[int] = frozenset()) -> None:
        self._owned: dict[int, str] = {}
        #: Ports of the stores this process serves (rank 0 hosts the wrapper's store): a peer's
        #: connection accepted there while a constructor runs is a store client (a rank's NVRx
        #: monitor process connecting late, on a loaded box), never gloo's. Cutting it broke that
        #: monitor ("Broken pipe"), so the next fault went unseen until the heartbeat timeout.
        self.served_ports = served_ports

    def track(self, create: Any) -> Any:
        """Wrap a process-group constructor: sockets that appear while it runs are recorded."""

        def tracked(*args: Any, **kwargs: Any) -> Any:
            before = _socket_inodes()
            try:
                return create(*args, **kwargs)
            finally:
                for fd, link in _socket_inodes().items():
                    if before.get(fd) != link:
                        self._owned[fd] = link

        tracked.__wrapped__ = create  # type: ignore[attr-defined]
        return tracked

    def _is_gloo(self, sock: socket.socket) -> bool:
        """TCP only (the launcher's rank-monitor IPC, a unix socket, may connect meanwhile), connected
        (not a listener), and neither end on a store's port (accepted by a store this process serves,
        or a client of one)."""
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return False
        ends = {int(sock.getsockname()[1]), int(sock.getpeername()[1])}
        return not ends & self.served_ports

    def cut(self) -> int:
        """shutdown(SHUT_RDWR) every recorded connection still open; return how many."""
        cut = 0
        owned, self._owned = self._owned, {}
        for fd, link in owned.items():
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != link:
                    continue  # closed, and the fd number reused by something else
                sock = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                if self._is_gloo(sock):
                    sock.shutdown(socket.SHUT_RDWR)
                    cut += 1
            except OSError:
                pass  # not connected (any more)
            finally:
                sock.close()  # closes our dup only; the library still owns fd
        return cut


def gloo_abort(sockets: GlooSockets) -> Any:
    """An NVRx Abort: cut gloo connections (wakes blocked collectives), then NVRx's own abort."""
    from nvidia_resiliency_ext import inprocess

    class AbortGloo(inprocess.abort.AbortTorchDistributed):  # type: ignore[misc]
        def __call__(self, state: Any) -> Any:
            sockets.cut()
            return super().__call__(state)

    return AbortGloo()


def build_wrapper(shim: RestartHost, store: tuple[str, int], sockets: GlooSockets | None = None) -> Any:
    """An `inprocess.Wrapper` configured from the profile's `[inprocess]` section."""
    from nvidia_resiliency_ext import inprocess

    cfg = shim.profile.inprocess
    checks: list[Any] = []
    if cfg.health_check:
        import torch

        if torch.cuda.is_available():
            checks.append(inprocess.health_check.CudaHealthCheck(timeout=_seconds(min(30.0, cfg.soft_timeout))))
    if cfg.max_rank_faults is not None:
        checks.append(inprocess.health_check.FaultCounter(max_rank_faults=cfg.max_rank_faults))
    health = inprocess.Compose(*checks) if len(checks) > 1 else (checks[0] if checks else None)
    logfile = None
    if shim.run_dir is not None:
        logfile = str((shim.run_dir / "logs" / f"inprocess-monitor-cycle{shim.cycle}-rank{{rank}}.log").absolute())
        os.makedirs(os.path.dirname(logfile), exist_ok=True)
    return inprocess.Wrapper(
        store_factory=inprocess.store.TCPStore,
        abort=gloo_abort(sockets) if sockets is not None else inprocess.abort.AbortTorchDistributed(),
        store_kwargs={
            "host_name": store[0], "port": store[1], "timeout": _seconds(cfg.barrier_timeout),
        },
        initialize=inprocess.initialize.RetryController(
            # NVRx counts iterations (the first run is iteration 0); the key counts restarts
            max_iterations=None if cfg.max_iterations is None else cfg.max_iterations + 1,
            min_world_size=min_world_size(shim),
        ),
        health_check=health,
        monitor_thread_interval=_seconds(cfg.monitor_interval),
        # NVRx 0.4.1's monitor process checks timeouts only when no message arrived within its
        # interval (a TIMESTAMP message `continue`s the loop). The progress watchdog sends one every
        # progress_interval even while the main thread is blocked, so with progress_interval <=
        # monitor interval the checks can starve and a hang is only caught when the launcher or
        # hard_timeout kills something. Poll at least twice per progress interval.
        monitor_process_interval=_seconds(min(cfg.monitor_interval, cfg.progress_interval / 2)),
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


def min_world_size(shim: RestartHost) -> int:
    """Every rank unless the profile opts into a smaller world (`inprocess.min_world_size`)."""
    wanted = shim.profile.inprocess.min_world_size
    return shim.world_size if wanted is None else min(wanted, shim.world_size)


def announce_world(shim: RestartHost) -> None:
    """Say when a smaller world may continue (opt-in), once, on rank 0."""
    smallest = min_world_size(shim)
    if smallest < shim.world_size:
        shim.events.emit("inprocess_world", min_world_size=smallest, world_size=shim.world_size)
        if int(os.environ.get("RANK", "0")) == 0:
            console.line(f"resctl: in-process restart may continue with as few as {smallest} of {shim.world_size} ranks "
                         "(inprocess.min_world_size); a rank lost to a SIGKILL is then not replaced until the launcher "
                         "restarts the group")


FAULT_KEY = "resctl/fault/{cycle}/{iteration}"  # in the app store: what failed in that iteration
FAULT_KEY_TIMEOUT = 2.0  # seconds a store call for the console line may take


def tell_rank0(app: Any, cycle: int, iteration: int, err: BaseException) -> None:
    """Leave this rank's failure where rank 0 reads it for the restart's console line. It is set
    before the exception reaches the wrapper, so before the restart it causes begins. The first
    failure wins; a peer's error ("Connection closed by peer" once the failed rank aborted) is kept
    apart, so it names the fault only when no rank had one of its own."""
    text = f"{type(err).__name__}: {err}"
    key = FAULT_KEY.format(cycle=cycle, iteration=iteration) + ("/peer" if PEER_ERROR.search(text) else "")
    try:
        # its own connection with a short timeout: the fault path never waits long on the store
        store = app.clone()
        store.set_timeout(datetime.timedelta(seconds=FAULT_KEY_TIMEOUT))
        store.compare_set(key, "", f"rank {os.environ.get('RANK', '?')} failed ({text[:200]})")
    except Exception:  # noqa: BLE001 - a console line is never worth hiding the fault itself
        pass


def restart_line(app: Any, shim: RestartHost, iteration: int) -> str:
    """`resctl: rank 1 failed (RuntimeError: ...); ranks re-run the script in place (in-process restart 1 of 3)`: the
    console line of one in-process restart, printed by rank 0 of the new iteration."""
    key = FAULT_KEY.format(cycle=shim.cycle, iteration=iteration - 1)
    cause = ""
    for name in (key, key + "/peer"):
        try:
            if app.check([name]):
                cause = app.get(name).decode()
                break
        except Exception:  # noqa: BLE001
            break
    cause = cause or "no rank raised (a hang, or a rank lost)"
    limit = shim.profile.inprocess.max_iterations
    count = f"in-process restart {iteration}" + (f" of {limit}" if limit is not None else "")
    return f"resctl: {cause}; ranks re-run the script in place ({count})"


def import_before_interrupts() -> None:
    """Import what torch imports lazily mid-script (`LATE_PRELOAD`: torch._dynamo and sympy with the first
    optimizer, FSDP with the first wrap) before the wrapper may interrupt the script. The wrapper's RankShouldRestart is
    raised asynchronously wherever the main thread is; raised inside such an import it left the module half
    executed for the next iteration ("module 'torch._dynamo' has no attribute 'utils'", seen under load).
    A script that builds an optimizer imports them anyway; a forked worker has them from the launcher
    (resctl.launch.preload) once its late preload ran."""
    for name in LATE_PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the script that needs it imports (and reports) it itself
            continue


def run_wrapped(shim: RestartHost, target: Target, on_fault: Callable[[BaseException], None] = lambda err: None) -> None:
    """Run `target` under the wrapper until it completes on every rank (or the wrapper gives up,
    which raises and so hands over to the launcher's in-job restart)."""
    import torch.distributed as dist
    from nvidia_resiliency_ext import inprocess
    from nvidia_resiliency_ext.inprocess.monitor_thread import RankShouldRestart

    import_before_interrupts()
    rank = int(os.environ["RANK"])
    app = app_store()
    announce_world(shim)
    endpoint = wrapper_store_endpoint(app, rank, shim.cycle)
    sockets = GlooSockets(served_ports=frozenset({endpoint[1], int(os.environ.get("MASTER_PORT", "0"))}))
    wrapper = build_wrapper(shim, endpoint, sockets)
    fresh = FreshState.capture() if shim.profile.inprocess.fresh_state else None
    patches = Patches("inprocess")
    patched_init = sockets.track(dist.init_process_group)
    patches.set(dist, "new_group", sockets.track(dist.new_group))
    current: dict[str, Any] = {"iteration": 0}

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        # A script's plain init_process_group() gets this iteration's fresh store. RANK and
        # WORLD_SIZE are read now: the wrapper may have renumbered ranks for this iteration.
        if kwargs.get("store") is None and kwargs.get("init_method") in (None, "env://"):
            kwargs.pop("init_method", None)
            kwargs["store"] = dist.PrefixStore(f"resctl/{shim.cycle}/{current['iteration']}", app)
            kwargs["rank"] = int(os.environ["RANK"])
            kwargs["world_size"] = int(os.environ["WORLD_SIZE"])
        return patched_init(*args, **kwargs)

    patches.set(dist, "init_process_group", init_process_group)

    def iteration(call_wrapper: Any = None) -> None:
        current["iteration"] = call_wrapper.iteration
        shim.events.iteration = call_wrapper.iteration
        shim.set_progress(call_wrapper.ping)
        if call_wrapper.iteration > 0:
            world = int(os.environ.get("WORLD_SIZE", shim.world_size))
            shim.events.emit("restart", layer="inprocess", step=shim.step, world_size=world)
            if int(os.environ.get("RANK", rank)) == 0:  # one line per restart, whichever rank faulted
                console.line(restart_line(app, shim, call_wrapper.iteration))
            shim.settle_checkpoint()
            if fresh is not None:
                fresh.restore()
        try:
            run_target(target)
        except SystemExit as exit_:
            if exit_.code not in (None, 0):
                raise
        except RankShouldRestart:
            raise  # another rank's fault (or our hang): the restart event of the next iteration says it
        except BaseException as err:
            if type(err).__name__ != "InjectedFault":  # injected ones were recorded when fired
                shim.events.emit("fault", cause="exception", injected=False, step=shim.step,
                                 error=f"{type(err).__name__}: {err}")
            tell_rank0(app, shim.cycle, current["iteration"], err)
            on_fault(err)
            raise
        finally:
            shim.set_progress(None)

    # NVRx passes the CallWrapper to a parameter annotated with its class (a real class, not the
    # string `from __future__ import annotations` makes); signature.bind runs first, hence the default.
    iteration.__annotations__ = {"call_wrapper": inprocess.CallWrapper, "return": None}
    try:
        wrapper(iteration)()
    finally:
        patches.undo()
