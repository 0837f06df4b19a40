"""Known differences from torchrun that are not fixed yet: case -> launcher -> reason.

Each entry makes its test xfail(strict=True): when the difference is fixed the test XPASSes, which
fails the run until the entry is removed here. docs/compat.md is generated with these reasons.
"""

from __future__ import annotations

EXPECTED: dict[str, dict[str, str]] = {}
