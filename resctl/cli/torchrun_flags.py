"""torchrun's flags, once: what `resctl run` accepts, its help and completions, and where each goes.

`FLAGS` is the one table. `resctl run`'s options are built from it (`options()`), so `--help` and
the generated completions (`resctl.cli.completions`) list exactly these; `layer()` turns the typed
values into the profile layer that beats the profile file and RESCTL_* (a typed flag always
wins), and `launcher_args()` passes the flags NVRx's ft_launcher takes as they are. A test checks
the table against the installed torchrun's parser, so a flag a new torch adds fails it.

Where a flag goes (`Flag.to`):

- `profile`: the profile key `Flag.key` (its schema documents it; `resctl run --dry-run` shows
  where every value came from). resctl's defaults are the AWS ones, not torchrun's: c10d
  rendezvous, 3 restarts, a 5 s monitor interval; `resctl run --help` shows each flag's key and
  default, read from the schema.
- `launcher`: passed to ft_launcher unchanged (torchrun's meaning, ft_launcher's implementation).
- `target`: how the worker runs the script (-m, --no-python; --run-path is what resctl's forked
  workers do anyway).
- `refused`: ft_launcher has no equivalent; typed, the job does not start (exit 2, the reason).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Mapping

import typer

from resctl.errors import UsageError


@dataclass(frozen=True)
class Flag:
    dest: str  # torchrun's argparse dest (and the Python parameter name)
    names: tuple[str, ...]
    help: str
    to: str  # profile, launcher, target, refused, resctl
    key: str = ""  # the profile key (to = profile/resctl)
    type: type = str  # str, int or bool (a switch)
    check: Callable[[Any], str | None] | None = None  # value -> what is wrong with it, or None
    noop: Any = None  # a refused flag's value that changes nothing (torchrun's default): accepted
    choices: tuple[str, ...] = ()  # the values it takes, when they are a fixed list (checked, completed)

    def __post_init__(self) -> None:
        if self.choices and self.check is None:
            object.__setattr__(self, "check", _choice(*self.choices))

    @property
    def aliases(self) -> tuple[str, ...]:
        """The underscore spellings torchrun also accepts: taken, but not offered by completion."""
        return tuple(name for name in self.names if name.startswith("--") and "_" in name)

    @property
    def shown(self) -> str:
        """The name in messages and launcher arguments: the first long one (dashes)."""
        return next(name for name in self.names if name.startswith("--"))


_NPROC = re.compile(r"^(auto|cpu|gpu|xpu|[1-9][0-9]*)$")
_NNODES = re.compile(r"^([1-9][0-9]*)(:([1-9][0-9]*))?$")


def _nproc(value: str) -> str | None:
    if _NPROC.match(value.strip()):
        return None
    return f"{value!r} is not a number of workers: give a positive integer, or auto, gpu, cpu, xpu (as torchrun)"


def _nnodes(value: str) -> str | None:
    match = _NNODES.match(value.strip())
    if match and (match.group(3) is None or int(match.group(1)) <= int(match.group(3))):
        return None
    return f"{value!r} is not a node count: give N or MIN:MAX with 1 <= MIN <= MAX (as torchrun)"


def _key_values(value: str) -> str | None:
    bad = [kv for kv in value.split(",") if "=" not in kv]
    return f"{bad[0]!r} is not KEY=VALUE; write --rdzv-conf key=value,key2=value2" if bad else None


def _positive(value: int) -> str | None:
    return None if value > 0 else f"{value} must be positive"


def _not_negative(value: int) -> str | None:
    return None if value >= 0 else f"{value} must be 0 or more"


def _port(value: int) -> str | None:
    return None if 0 < value < 65536 else f"{value} is not a TCP port (1-65535)"


def _choice(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in allowed else f"{value!r} is not one of {', '.join(allowed)}"

    return check


def _names(dest: str, *short: str) -> tuple[str, ...]:
    dashed = "--" + dest.replace("_", "-")
    under = "--" + dest
    return (*short, dashed) if dashed == under else (*short, dashed, under)


def _refused(dest: str, why: str, *short: str, type_: type = str, noop: Any = None) -> Flag:
    return Flag(dest, _names(dest, *short), f"torchrun's --{dest.replace('_', '-')}: {why}", "refused", type=type_,
                noop=noop)


FLAGS: tuple[Flag, ...] = (
    Flag("nnodes", _names("nnodes"), "Number of nodes, or MIN:MAX.", "profile", "launch.nnodes", check=_nnodes),
    Flag("nproc_per_node", _names("nproc_per_node"), "Workers per node: a number, or auto, gpu, cpu, xpu.",
         "profile", "launch.nproc_per_node", check=_nproc),
    Flag("node_rank", _names("node_rank"), "This node's rank (static rendezvous).", "profile", "launch.node_rank",
         int, _not_negative),
    Flag("rdzv_backend", _names("rdzv_backend"), "Rendezvous backend (ft_launcher: c10d).", "profile",
         "launch.rdzv_backend", choices=("c10d",)),
    Flag("rdzv_endpoint", _names("rdzv_endpoint"), "Rendezvous HOST:PORT, or auto.", "profile", "launch.rdzv_endpoint"),
    Flag("rdzv_id", _names("rdzv_id"), "Job id shared by all nodes.", "profile", "launch.rdzv_id"),
    Flag("rdzv_conf", _names("rdzv_conf"), "Extra rendezvous settings k=v,k=v.", "profile", "launch.rdzv_conf",
         check=_key_values),
    Flag("standalone", ("--standalone",), "Single-node rendezvous on a free port.", "profile", "launch.standalone", bool),
    Flag("max_restarts", _names("max_restarts"), "In-job restarts before failing.", "profile",
         "launch.max_restarts", int, _not_negative),
    Flag("monitor_interval", _names("monitor_interval"), "Launcher poll interval: seconds or 5s, 500ms "
         "(a worker's exit is seen at once).", "profile", "launch.monitor_interval"),
    Flag("start_method", _names("start_method"), "fork: workers forked from the launcher, which has imported torch; spawn, "
         "forkserver: each worker a fresh interpreter.",
         "profile", "launch.start_method", choices=("fork", "spawn", "forkserver")),
    _refused("event_log_handler", "not in NVRx's ft_launcher (null, torchrun's default, is accepted)", noop="null"),
    Flag("role", _names("role"), "User-defined role of the workers.", "launcher"),
    Flag("module", ("-m", "--module"), "Run SCRIPT as a module (python -m).", "target", type=bool),
    Flag("no_python", _names("no_python"), "Run SCRIPT as a program, not with python.", "target", type=bool),
    Flag("run_path", _names("run_path"), "Run SCRIPT with runpy.run_path in the worker (what resctl's forked "
         "workers do).", "target", type=bool),
    Flag("log_dir", _names("log_dir"), "Worker log directory (default <run_dir>/logs).", "profile", "launch.log_dir"),
    Flag("redirects", ("-r", "--redirects"), "Redirect worker std streams to log files (0-3, or per rank).",
         "profile", "launch.redirects"),
    Flag("tee", ("-t", "--tee"), "Tee worker std streams to log files (0-3, or per rank).", "profile", "launch.tee"),
    Flag("local_ranks_filter", _names("local_ranks_filter"), "Only these local ranks' output on the console "
         "(e.g. 0,1).", "launcher"),
    _refused("duplicate_stdout_filters", "not in NVRx's ft_launcher; use --tee or the run directory's logs"),
    _refused("duplicate_stderr_filters", "not in NVRx's ft_launcher; use --tee or the run directory's logs"),
    Flag("master_addr", _names("master_addr"), "Master address (static rendezvous).", "profile", "launch.master_addr"),
    Flag("master_port", _names("master_port"), "Master port (static rendezvous).", "profile", "launch.master_port",
         int, _port),
    Flag("local_addr", _names("local_addr"), "Address of this node.", "profile", "launch.local_addr"),
    Flag("logs_specs", _names("logs_specs"), "torchrun's LogsSpecs entry point name.", "launcher"),
    _refused("numa_binding", "not in NVRx's ft_launcher; bind with numactl in the script's environment"),
    _refused("signals_to_handle", "resctl forwards SIGTERM, SIGINT, SIGUSR1 and SIGUSR2 to the launcher"),
    Flag("shutdown_timeout", _names("shutdown_timeout"), "Seconds between SIGTERM and SIGKILL when the job is "
         "stopped (launch.term_timeout).", "profile", "launch.term_timeout", int, _positive),
    _refused("virtual_local_rank", "not in NVRx's ft_launcher", type_=bool),
    # resctl's own (not torchrun's)
    Flag("run_dir", ("--run-dir",), "Run directory for events and summaries ({run_id} expands).", "resctl",
         "launch.run_dir"),
    Flag("metrics_port", ("--metrics-port",), "Serve Prometheus metrics on this port (0: a free one).", "resctl",
         "launch.metrics_port", int, _not_negative),
    Flag("metrics_addr", ("--metrics-addr",), "Address metrics listen on (127.0.0.1 keeps them on the node).", "resctl", "launch.metrics_addr"),
)
BY_DEST = {flag.dest: flag for flag in FLAGS}
TORCHRUN_DESTS = tuple(flag.dest for flag in FLAGS if flag.to != "resctl")


def help_text(flag: Flag) -> str:
    """The flag's help; a profile flag's default and key come from the schema (one source). Read
    when `resctl run --help` is shown (`resctl.cli.command`), so other commands never load the schema."""
    if flag.to not in ("profile", "resctl") or flag.type is bool:
        return flag.help
    from resctl.profile.render import default_text

    shown = default_text(flag.key)
    return f"{flag.help} [{flag.key}" + (f", default {shown}]" if shown else "]")


def options() -> list[inspect.Parameter]:
    """`resctl run`'s parameters for every flag of the table (keyword-only, default unset)."""
    params = []
    for flag in FLAGS:
        if flag.type is bool:
            hint: Any = Annotated[bool, typer.Option(*flag.names, help=flag.help)]
            default: Any = False
        else:
            hint = Annotated[flag.type | None, typer.Option(*flag.names, help=flag.help)]  # type: ignore[name-defined]
            default = None
        params.append(inspect.Parameter(flag.dest, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
    return params


def given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The flags the user typed (a switch: when on), checked; a bad value or a refused flag is a
    UsageError (exit 2) before anything starts."""
    out = {}
    for dest, value in values.items():
        flag = BY_DEST.get(dest)
        if flag is None or value is None or value is False:
            continue
        if flag.check is not None:
            problem = flag.check(value.strip() if isinstance(value, str) else value)
            if problem:
                raise UsageError(f"{flag.shown}: {problem}")
        if flag.to == "refused" and value != flag.noop:
            raise UsageError(f"{flag.shown} is not supported: {flag.help.split(': ', 1)[1]}")
        out[dest] = value
    return out


def layer(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(profile key -> value, profile key -> source label) of the typed profile flags.

    `--start-method` is torchrun's meaning: spawn or forkserver start each worker as a new
    interpreter (`launch.worker_start = "exec"`); fork forks it from the launcher."""
    keys: dict[str, Any] = {}
    labels: dict[str, str] = {}
    for dest, value in values.items():
        flag = BY_DEST[dest]
        if flag.to not in ("profile", "resctl"):
            continue
        if dest == "rdzv_conf":
            value = dict(kv.split("=", 1) for kv in value.split(","))
        keys[flag.key] = value
        labels[flag.key] = f"flag {flag.shown}"
        if dest == "start_method":
            keys["launch.worker_start"] = "fork" if value == "fork" else "exec"
            labels["launch.worker_start"] = f"flag {flag.shown} {value}"
    return keys, labels


def launcher_args(values: Mapping[str, Any]) -> list[str]:
    """ft_launcher arguments for the typed flags it takes as they are."""
    args: list[str] = []
    for dest, value in values.items():
        flag = BY_DEST[dest]
        if flag.to == "launcher":
            args += [flag.shown, str(value)]
    return args
