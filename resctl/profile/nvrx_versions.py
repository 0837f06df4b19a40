"""Which ft_launcher series an NVRx version belongs to: the one rule the profile schema
(`launch.nvrx_version`) and the launch plan (`resctl.launch.nvrx_flags`) share. Lives in the
profile layer so the schema needs nothing from `resctl.launch`."""

from __future__ import annotations

from resctl.errors import UsageError

#: The NVRx versions resctl drives: 0.4.x and 0.6.x-0.7.x (0.5 is a hybrid neither series describes),
#: and the releases each was checked on (the launch flags, `resctl.launch.nvrx_private`, CI's two passes).
SUPPORTED = "0.4.x or 0.6.x-0.7.x"
CHECKED = ("0.4.1", "0.6.0", "0.7.0")
_NEWEST = (0, 7)


def _major_minor(version: str) -> tuple[int, int]:
    # "0.7.0", "0.7.0rc1", "0.7.0.dev3+gabc", "0.4.1+cuda12" -> (0, 7) / (0, 4)
    parts = version.strip().lstrip("v").split(".")
    try:
        major = int(parts[0])
        minor = int("".join(ch for ch in parts[1] if ch.isdigit()) or "x") if len(parts) > 1 else 0
    except ValueError:
        raise UsageError(
            f"cannot read NVRx version {version!r}; set launch.nvrx_version to a version such as 0.4.1 or 0.7.0"
        ) from None
    return major, minor


def series_for(version: str) -> str:
    """The series name ("0.4" or "0.6+") of an NVRx version string such as "0.7.0".

    Raises:
        UsageError: for versions before 0.4, for 0.5.x, for versions newer than resctl was checked on
            (`SUPPORTED`), and for strings that are not versions.
    """
    major, minor = _major_minor(version)
    if (major, minor) == (0, 4):
        return "0.4"
    if (0, 6) <= (major, minor) <= _NEWEST:
        return "0.6+"
    newer = (major, minor) > _NEWEST
    raise UsageError(
        f"NVRx {version} is not supported: resctl drives NVRx {SUPPORTED} (checked on {', '.join(CHECKED)})"
        + (", and every release has moved internals resctl's launcher relies on" if newer else "")
        + ". Install one of those (pip install 'nvidia-resiliency-ext>=0.6,<0.8', or 0.4.1 on glibc < 2.39), "
        "or set launch.nvrx_version to the version you run."
    )
