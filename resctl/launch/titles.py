"""Process titles, so `ps` and `pgrep` tell the launcher and each worker apart.

Forked workers share the launcher's command line (`python -m resctl.launch.ft_entry ...`), so the
title is all that tells them apart: `resctl-launcher train.py`, `resctl-worker rank=3 local=3
train.py`. `setproctitle` rewrites what `ps -ef`/`pgrep -f` show; the kernel's short name (`comm`,
15 bytes, what plain `pgrep` and `top` show) is set too, so both spellings find them.
"""

from __future__ import annotations

import ctypes

from resctl.launch.lifeline import libc

_PR_SET_NAME = 15


def set_title(title: str) -> None:
    try:
        import setproctitle

        setproctitle.setproctitle(title)
    except Exception:  # noqa: BLE001 - not installed, or no argv to rewrite: the short name still helps
        pass
    try:
        libc().prctl(_PR_SET_NAME, ctypes.c_char_p(title.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def worker_title(rank: int, local_rank: int, script: str) -> str:
    return f"resctl-worker rank={rank} local={local_rank} {script}"
