"""Set `[checkpoint]` keys (`interval_steps`, `memory_every`) in a TOML profile, keeping every other byte.

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
_KEY = r"^(?P<indent>\s*){key}(?P<eq>\s*=\s*)(?P<value>[^#\n]*?)(?P<rest>\s*(#.*)?)$"


class ProfileEditError(ValueError):
    """The profile cannot be edited safely (the message says why)."""


def set_interval(text: str, interval_steps: int) -> str:
    """`text` with `[checkpoint] interval_steps = interval_steps`, otherwise unchanged."""
    return set_key(text, "interval_steps", interval_steps)


def set_key(text: str, name: str, value: int) -> str:
    """`text` with `[checkpoint] <name> = value`, otherwise unchanged."""
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ProfileEditError(f"not valid TOML: {err}") from err
    pattern = re.compile(_KEY.format(key=re.escape(name)))
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
            key = pattern.match(line.rstrip("\r\n"))
            if key:
                ending = line[len(line.rstrip("\r\n")):]
                lines[i] = f"{key.group('indent')}{name}{key.group('eq')}{value}{key.group('rest')}{ending}"
                done = True
                break
    if not done:
        newline = "\r\n" if "\r\n" in text else "\n"
        if header_at is not None:
            lines.insert(header_at + 1, f"{name} = {value}{newline}")
        else:
            if lines and not lines[-1].endswith(("\n", "\r")):
                lines[-1] += newline
            if lines and lines[-1].strip():
                lines.append(newline)
            lines += [f"[checkpoint]{newline}", f"{name} = {value}{newline}"]
    result = "".join(lines)
    try:
        parsed = tomllib.loads(result)
    except tomllib.TOMLDecodeError as err:
        raise ProfileEditError(f"the edit would break the file ({err}); set checkpoint.{name} by hand") from err
    if parsed.get("checkpoint", {}).get(name) != value:
        raise ProfileEditError(f"checkpoint.{name} is written in a form this edit does not change "
                               "(inline table or dotted key); set it by hand")
    return result


def write_interval(path: Path, interval_steps: int) -> bool:
    """Update (or create) the profile at `path`; return True when the file changed."""
    return write_keys(path, {"interval_steps": interval_steps})


def write_keys(path: Path, values: dict[str, int]) -> bool:
    """Set these `[checkpoint]` keys in the profile at `path` (created if absent), all or none;
    return True when the file changed."""
    try:
        before = path.read_text(encoding="utf-8") if path.exists() else ""
    except (OSError, UnicodeDecodeError) as err:
        raise ProfileEditError(f"cannot read it: {err}") from err
    after = before
    for name, value in values.items():
        after = set_key(after, name, value)
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
