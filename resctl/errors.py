"""Typed errors raised by the library; only `resctl.cli` renders them and picks exit codes."""

from __future__ import annotations

from dataclasses import dataclass, field

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: The job stopped itself because its restarts made no progress (health.no_progress_cycles): NVRx >= 0.6's
#: "do not requeue" code, so a scheduler rule written for one holds for both.
EXIT_NO_PROGRESS = 93
#: This node was left out of the job by the cluster preflight (health.preflight_policy = "exclude").
EXIT_EXCLUDED = 94
#: The rendezvous store became unreachable (its `resctl store` process, or with launch.store = "node" the
#: node that hosted it, is gone): no restart round can be held, so every node stops (issue 42).
EXIT_STORE_LOST = 95


class ResctlError(Exception):
    """Base class: `str(err)` is the whole message a user sees."""

    exit_code = EXIT_FAILURE


@dataclass
class Problem:
    """One thing wrong with a profile: where, what, and how to fix it."""

    source: str  # "profile.toml", "env RESCTL_LAUNCH_NNODES", "--set", "flag --nnodes"
    key: str  # "heartbeat.timeout"
    message: str
    value: object = None
    fix: str = ""

    def render(self) -> str:
        head = f"{self.source} -> {self.key}" if self.key else self.source
        lines = [f"{head}: {self.message}"]
        if self.value is not None:
            shown = repr(self.value)
            lines.append(f"    value: {shown if len(shown) <= 200 else shown[:160] + f'... ({len(shown)} characters)'}")
        if self.fix:
            lines.append(f"    fix:   {self.fix}")
        return "\n".join(lines)


@dataclass
class ProfileError(ResctlError):
    """Every problem found in the layered profile, reported together."""

    problems: list[Problem] = field(default_factory=list)
    #: The profile without the keys that failed (their defaults instead), when that one is valid:
    #: what `resctl profile validate` checks the rules beyond the schema on. Any, not Profile: no import circle.
    partial: object = None
    exit_code = EXIT_USAGE

    def __str__(self) -> str:
        n = len(self.problems)
        head = "invalid profile" if n == 1 else f"invalid profile ({n} problems)"
        return head + ":\n" + "\n".join(p.render() for p in self.problems)


class UsageError(ResctlError):
    """A bad command line (missing script, conflicting flags)."""

    exit_code = EXIT_USAGE


class LaunchError(ResctlError):
    """The launcher could not be planned or started."""

    exit_code = EXIT_FAILURE
