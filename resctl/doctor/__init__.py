"""`resctl doctor`: is this node fit to train, and if not, what exactly is wrong?

Run it where the job will run (an init container, a Slurm prolog, before `resctl run`):

    resctl doctor -p prod.toml                # table on stderr; exit 0 fit, 1 something FAILed
    resctl doctor --json | jq .status         # one JSON document on stdout (schema: docs/doctor.md)
    resctl doctor --only gpu,nvlink --strict  # WARN fails too
    resctl doctor --deep                      # + matmul and copy bandwidth per GPU, GPU-to-GPU

Probes (one module each; every one returns `Check`s with PASS/WARN/FAIL/SKIP, the measured and
expected values, a message and a fix): gpu, nvlink, efa, storage, shm, memlock, env, dns,
clock, memory. Their module docstrings list each verdict and its threshold.

Expectations come from the profile's `[doctor]` section over defaults per instance type
(`resctl.doctor.expectations.KNOWN`; p5.48xlarge: 8 H100, 18 NVLinks per GPU, 32 EFA devices).

Library use::

    from resctl.doctor import make_context, run, select
    report = run(make_context(profile), select(only=["storage"]))
    report.exit_code(strict=False)

Every probe reads through a `Context` (root directory, NVML adapter, environment), so the
tests run them against fixture trees under tests/fixtures/nodes/.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping

from resctl.doctor.context import Context, Progress, installed_cuda_runtime
from resctl.doctor.expectations import Expectations
from resctl.doctor.expectations import resolve as resolve_expectations
from resctl.doctor.nvml import Nvml
from resctl.doctor.result import Check, ProbeResult, Report, Status
from resctl.doctor.runner import PROBES, run, select
from resctl.launch.plan import inprocess_env
from resctl.profile.schema import Profile

__all__ = ["Check", "Context", "Expectations", "PROBES", "ProbeResult", "Report", "Status", "make_context", "run",
           "select"]


def make_context(
    profile: Profile,
    *,
    root: Path = Path("/"),
    env: Mapping[str, str] | None = None,
    checkpoint_dir: str | None = None,
    deep: bool = False,
    nvml_factory: Callable[[], Nvml] | None = None,
    progress: Progress | None = None,
    explicit: frozenset[str] = frozenset(),
    cwd: Path | None = None,
) -> Context:
    """Build the probes' Context for a resolved profile.

    Args:
        root: "/" probes this machine; another directory is read as a node snapshot.
        env: the launcher's environment (default os.environ); the profile's launch.env and what the
            plan adds for the workers (`launch.plan.inprocess_env`) are laid over it.
        checkpoint_dir: the directory to test instead of checkpoint.dir. A relative path is taken
            from `cwd` on a live node and from the root of a snapshot.
        explicit: dotted profile keys the user set (see `expectations.resolve`).
    """
    root = Path(root)
    env = dict(os.environ if env is None else env)
    env.update(profile.launch.env)
    added = inprocess_env(profile, env)  # what the plan sets for the workers (NCCL_NVLS_ENABLE=0, ...)
    env.update(added)
    directory = checkpoint_dir or profile.checkpoint.dir
    if not os.path.isabs(directory):
        base = str(cwd or Path.cwd()) if root == Path("/") else "/"
        directory = os.path.normpath(os.path.join(base, directory))
    return Context(root=root, expect=resolve_expectations(profile, root, explicit), profile=profile, env=env,
                   checkpoint_dir=directory, deep=deep, nvml_factory=nvml_factory, planned_env=added,
                   cuda_runtime=installed_cuda_runtime(), progress=progress)
