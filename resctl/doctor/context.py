"""Everything a probe reads comes through a `Context`: the filesystem root, NVML, the
environment the workers will get, the expectations and the profile.

With ``root == /`` (the default) probes read the live node. With another root (a fixture tree or
a copied snapshot) every absolute path is read below it, NVML answers come from
``<root>/nvml.json`` and file-system sizes from ``<root>/statvfs.json`` when that file exists
(a statvfs of a path in a copied tree would describe the developer's disk, not the node's).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from resctl.doctor.expectations import Expectations
from resctl.doctor.nvml import Nvml, NvmlUnavailable, PynvmlAdapter, SnapshotNvml
from resctl.profile.schema import Profile

#: (phase, bytes done, bytes total): how the storage probe reports progress to the CLI.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Space:
    """Size and free space of a file system, in bytes."""

    total: int
    free: int


@dataclass
class Context:
    """What probes may read. One is built per `resctl doctor` run; see `make_context`.

    Attributes:
        root: where the node's /sys, /proc, /dev and mounts are read.
        expect: what the node should have.
        profile: the resolved profile (checkpoint dir, rendezvous, in-process settings).
        env: the environment the workers will see: the launcher's plus the profile's launch.env plus
            what the plan adds (in-process restart's NCCL settings).
        planned_env: the part of `env` the plan adds (so a verdict can say resctl set it).
        checkpoint_dir: the directory the storage probe tests, as the job will see it.
        deep: run the GPU benchmarks (imports torch).
        nvml_factory: makes the NVML adapter; called at most once, lazily, by the first probe
            that needs it. Tests pass a fake.
        cuda_runtime: (major, minor) of the CUDA runtime torch was built with, if known.
        progress: called by long probes with (phase, done, total); None: no progress shown.
        cancel: set by the runner when the probe's deadline has passed; long loops stop early.
    """

    root: Path
    expect: Expectations
    profile: Profile
    env: Mapping[str, str]
    checkpoint_dir: str
    deep: bool = False
    planned_env: Mapping[str, str] = field(default_factory=dict)
    nvml_factory: Callable[[], Nvml] | None = None
    cuda_runtime: tuple[int, int] | None = None
    progress: Progress | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    _nvml: Nvml | None = field(default=None, repr=False)
    _nvml_error: str | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def live(self) -> bool:
        """True when probing this machine, not a snapshot tree."""
        return self.root == Path("/")

    def path(self, absolute: str | os.PathLike[str]) -> Path:
        """`absolute` as seen under the root."""
        p = Path(absolute)
        return self.root / p.relative_to(p.anchor) if p.is_absolute() else p

    def read(self, absolute: str) -> str | None:
        """The text of a file under the root, or None when it cannot be read."""
        try:
            return self.path(absolute).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None

    def space(self, absolute: str) -> Space:
        """Size and free space of the file system holding `absolute`.

        Raises:
            OSError: the path (or its snapshot entry) does not exist.
        """
        snap = self.read("/statvfs.json") if not self.live else None
        if snap is not None:
            table = json.loads(snap)
            best = max((k for k in table if _under(absolute, k)), key=len, default=None)
            if best is None:
                raise FileNotFoundError(f"statvfs.json has no entry covering {absolute}")
            return Space(int(table[best]["total"]), int(table[best]["free"]))
        st = os.statvfs(self.path(absolute))
        return Space(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)

    def nvml(self) -> Nvml:
        """The NVML adapter, made on first use and shared by all probes.

        Raises:
            NvmlUnavailable: no NVML here; the same reason on every later call.
        """
        with self._lock:
            if self._nvml is None and self._nvml_error is None:
                try:
                    factory = self.nvml_factory or (PynvmlAdapter if self.live
                                                    else lambda: SnapshotNvml(self.path("/nvml.json")))
                    self._nvml = factory()
                except NvmlUnavailable as err:
                    self._nvml_error = str(err)
            if self._nvml is None:
                raise NvmlUnavailable(self._nvml_error or "NVML unavailable")
            return self._nvml

    def for_probe(self) -> Context:
        """A view of this context with its own cancel event (shares NVML and everything else)."""
        view = Context.__new__(Context)
        view.__dict__.update(self.__dict__)
        view.cancel = threading.Event()
        return view


def _under(path: str, prefix: str) -> bool:
    prefix = prefix.rstrip("/") or "/"
    return prefix == "/" or path == prefix or path.startswith(prefix + "/")


def installed_cuda_runtime() -> tuple[int, int] | None:
    """CUDA major.minor of the installed torch build, read from its metadata (torch is not imported).

    "2.11.0+cu130" -> (13, 0); a CPU build or no torch -> None. Wheels without a local tag
    (PyPI's default Linux build) name their runtime in the nvidia-cuda-runtime dependency.
    """
    from importlib import metadata

    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    local = version.partition("+")[2]
    if local.startswith("cu") and local[2:].isdigit() and len(local) >= 4:
        return int(local[2:-1]), int(local[-1])
    if local:
        return None  # cpu, rocm, xpu builds
    for dist in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12",
                 "nvidia-cuda-runtime-cu11"):
        try:
            major, minor = metadata.version(dist).split(".")[:2]
            return int(major), int(minor)
        except (metadata.PackageNotFoundError, ValueError):
            continue
    return None
