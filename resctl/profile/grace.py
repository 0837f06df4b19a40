"""The stop sequence must nest, or the final checkpoint is cut short.

When a pod or a Slurm step is told to stop, SIGTERM goes resctl -> ft_launcher -> workers. Each
worker writes its final checkpoint within ``checkpoint.sigterm_grace``; ft_launcher SIGKILLs the
workers ``launch.term_timeout`` after forwarding SIGTERM; the scheduler SIGKILLs everything after
its own grace (Kubernetes ``terminationGracePeriodSeconds``; on Slurm the ``--signal`` lead time,
``KillWait`` or the partition's ``GraceTime``). So::

    checkpoint.sigterm_grace  <  launch.term_timeout  <  the scheduler's grace

`problems` checks the pairs it can see: the first always (when ``save_on_sigterm`` is on), the
second when the scheduler's grace is known. In a pod the kit passes it as
``TERMINATION_GRACE_PERIOD_SECONDS`` (the downward API cannot expose the field itself), rendered
from the same value as the pod spec's field. `resctl profile validate` and the doctor's ``grace``
probe report them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from resctl.errors import Problem
from resctl.profile.schema import Profile

__all__ = ["GRACE_ENV", "problems", "scheduler_grace"]

#: Seconds the scheduler waits between SIGTERM and SIGKILL, as the deployment kit exposes it.
GRACE_ENV = "TERMINATION_GRACE_PERIOD_SECONDS"


def scheduler_grace(env: Mapping[str, str]) -> tuple[float | None, list[Problem]]:
    """The scheduler's grace from `env` (None when not given), or a problem when it is not a number."""
    raw = env.get(GRACE_ENV, "").strip()
    if not raw:
        return None, []
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value > 0):
        return None, [Problem(f"env {GRACE_ENV}", "", "not a positive number of seconds", raw,
                              "render it from the same value as the pod's terminationGracePeriodSeconds")]
    return value, []


def problems(profile: Profile, source: str, grace: float | None = None) -> list[Problem]:
    """Where the stop sequence does not nest (empty when it does).

    Args:
        profile: the resolved profile.
        source: where the profile came from (a file name), for the messages.
        grace: the scheduler's SIGTERM-to-SIGKILL time in seconds; None when unknown.
    """
    ckpt, term = profile.checkpoint, profile.launch.term_timeout
    found = []
    if ckpt.save_on_sigterm and ckpt.sigterm_grace >= term:
        found.append(Problem(
            source, "checkpoint.sigterm_grace",
            f"the final save may take {ckpt.sigterm_grace:g}s but ft_launcher SIGKILLs the workers "
            f"launch.term_timeout = {term:g}s after forwarding SIGTERM",
            f"{ckpt.sigterm_grace:g}s",
            f"make checkpoint.sigterm_grace shorter than launch.term_timeout (e.g. {term * 0.75:g}s), "
            "or launch.term_timeout longer"))
    if grace is not None and term >= grace:
        found.append(Problem(
            source, "launch.term_timeout",
            f"ft_launcher waits {term:g}s for the workers but the scheduler SIGKILLs the pod {grace:g}s after "
            f"SIGTERM ({GRACE_ENV})",
            f"{term:g}s",
            f"raise the pod's terminationGracePeriodSeconds above {term:g}s (with a margin for the launcher "
            "to exit), or shorten launch.term_timeout and checkpoint.sigterm_grace"))
    return found
