"""Typed errors of resctl.checkpoint (the CLI renders them; `exit_code` picks the exit status)."""

from __future__ import annotations

from resctl.errors import EXIT_USAGE, ResctlError


class CheckpointError(ResctlError):
    """A checkpoint could not be saved or loaded (the message says what failed and what to do)."""


class CheckpointMismatch(CheckpointError):
    """An intact checkpoint that does not fit the state it would be loaded into (other names,
    shapes, dtypes or kind): a code or config change, not damage, so nothing is skipped or moved."""

    exit_code = EXIT_USAGE


class CheckpointDirInUse(CheckpointError):
    """Another live job owns the checkpoint directory."""

    exit_code = EXIT_USAGE


class SaveFailuresExceeded(CheckpointError):
    """`checkpoint.max_failed_saves` consecutive saves failed: the job stops with their cause."""
