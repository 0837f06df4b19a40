"""Start-up trace for bench/start_trace.py: every Python process started with this directory on PYTHONPATH
appends `time pid event detail` lines to $RESCTL_START_TRACE (the file): its start, the first import of a few
heavy packages, shared libraries loaded through ctypes, processes it forks, execs or spawns, and its exit.
A diagnostic of where a job's first and last seconds go, across the CLI, the launcher and the workers."""

import atexit
import os
import sys
import time

_PATH = os.environ.get("RESCTL_START_TRACE")
_WATCH = ("torch", "torch.cuda", "torch.distributed", "torch._dynamo", "torch.distributed.fsdp", "numpy",
          "pydantic", "typer", "rich", "nvidia_resiliency_ext", "nvidia_resiliency_ext.fault_tolerance.launcher",
          "pynvml", "resctl.cli", "resctl.launch.execute", "resctl.launch.ft_entry", "resctl.shim",
          "resctl.shim.runtime", "resctl.health.watch", "torch.distributed.elastic.agent.server.api")
_seen = set()


def _log(event, detail=""):
    try:
        with open(_PATH, "a", encoding="utf-8") as f:
            f.write(f"{time.time():.6f} {os.getpid()} {event} {detail}\n")
    except OSError:
        pass


def _hook(event, args):
    if event == "import":
        name = args[0]
        if name in _WATCH and name not in _seen:
            _seen.add(name)
            _log("import", f"{name} from {_caller()}")
    elif event == "ctypes.dlopen":
        _log("dlopen", f"{args[0]} from {_caller()}")
    elif event in ("os.fork", "os.posix_spawn", "os.exec"):
        _log(event, " ".join(str(a) for a in (args[1] if event != "os.fork" and len(args) > 1 else ()))[:200])
    elif event == "subprocess.Popen":
        _log("popen", " ".join(str(a) for a in args[1])[:200] if len(args) > 1 and args[1] else "")


def _caller():
    """The innermost frames outside ctypes and importlib: who loaded it."""
    frame, where = sys._getframe(2), []
    while frame is not None and len(where) < 4:
        name = frame.f_code.co_filename
        if not any(s in name for s in ("ctypes", "importlib", "pynvml", "threading")):
            where.append(f"{'/'.join(name.split('/')[-2:])}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(where)


def _after_fork():
    _seen.clear()
    _log("forked-child", "")


if _PATH:
    _log("start", " ".join(sys.argv)[:200] if hasattr(sys, "argv") else "")
    sys.addaudithook(_hook)
    os.register_at_fork(after_in_child=_after_fork)
    atexit.register(_log, "exit", "")
    # another sitecustomize further down sys.path still runs
    _here = os.path.dirname(os.path.abspath(__file__))
    _rest = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    import importlib.machinery
    _spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _rest)
    if _spec is not None and _spec.loader is not None:
        _mod = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_mod)
