"""The memory tier's checksum, without torch (the replica server in `resctl run` uses it too).

CRC32C (hardware-accelerated, ~13 GB/s on one core here) when the `crc32c` module is present,
else zlib's CRC32; manifests name which (`CHECKSUM`), and a reader refuses the other.
"""

from __future__ import annotations

import zlib
from typing import Any

try:
    import crc32c as _crc32c

    CHECKSUM = "crc32c"
    POLY = 0x82F63B78  # reflected Castagnoli polynomial

    def checksum(data: Any, value: int = 0) -> int:
        return int(_crc32c.crc32c(data, value))

except ImportError:  # pragma: no cover - crc32c is a dependency; zlib is the fallback
    CHECKSUM = "crc32"
    POLY = 0xEDB88320

    def checksum(data: Any, value: int = 0) -> int:
        return zlib.crc32(data, value)
