"""Set `[checkpoint] interval_steps` in a TOML profile and keep every other byte of the file.

A line edit, not a TOML round trip: comments, key order, quoting and blank lines stay as the
user wrote them. The value line is replaced in place (its trailing comment kept); a missing key
is added right under the `[checkpoint]` header; a missing section is appended. The result is
parsed again and must hold the new value, so a profile that spells the key some other way (an
inline table, a dotted key at the top level) is refused instead of being silently left alone.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_HEADER = re.compile(r"^\s*\[\s*(?P<name>[^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"^(?P<indent>\s*)interval_steps(?P<eq>\s*=\s*)(?P<value>[^#\n]*?)(?P<rest>\s*(#.*)?)$")


class ProfileEditError(ValueError):
    """The profile cannot be edited safely (the message says why)."""


def set_interval(text: str, interval_steps: int) -> str:
    """`text` with `[checkpoint] interval_steps = interval_steps`, otherwise unchanged."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ProfileEditError(f"not valid TOML: {err}") from err
    lines = text.splitlines(keepends=True)
    section: str | None = None
    header_at: int | None = None
    done = False
    for i, line in enumerate(lines):
        head = _HEADER.match(line)
        if head:
            section = head.group("name").strip().strip('"')
            if section == "checkpoint":
                header_at = i
            continue
        if section == "checkpoint":
            key = _KEY.match(line.rstrip("\r\n"))
            if key:
                ending = line[len(line.rstrip("\r\n")):]
                lines[i] = f"{key.group('indent')}interval_steps{key.group('eq')}{interval_steps}{key.group('rest')}{ending}"
                done = True
                break
    if not done:
        newline = "\r\n" if "\r\n" in text else "\n"
        if header_at is not None:
            lines.insert(header_at + 1, f"interval_steps = {interval_steps}{newline}")
        else:
            if lines and not lines[-1].endswith(("\n", "\r")):
                lines[-1] += newline
            if lines and lines[-1].strip():
                lines.append(newline)
            lines += [f"[checkpoint]{newline}", f"interval_steps = {interval_steps}{newline}"]
    result = "".join(lines)
    try:
        parsed = tomllib.loads(result)
    except tomllib.TOMLDecodeError as err:
        raise ProfileEditError(f"the edit would break the file ({err}); set checkpoint.interval_steps by hand") from err
    if parsed.get("checkpoint", {}).get("interval_steps") != interval_steps:
        raise ProfileEditError("checkpoint.interval_steps is written in a form this edit does not change "
                               "(inline table or dotted key); set it by hand")
    return result


def write_interval(path: Path, interval_steps: int) -> bool:
    """Update (or create) the profile at `path`; return True when the file changed."""
    try:
        before = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileEditError(f"cannot read it: {err}") from err
    after = set_interval(before, interval_steps)
    if after == before:
        return False
    # Write aside and rename, so an interrupted write never leaves half a profile.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(after)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True
