"""A store wrapper that counts round trips and bytes: machine-independent measures of a protocol.

Each simulated node or rank has its own `Counting` (no lock on the hot path); `total` sums them.
Every method of a c10d store used by the pieces under test is one round trip to the server
(`multi_get` / `multi_set` included: one request, however many keys).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 8


class Counting:
    """Duck-typed `torch.distributed.Store` over a real one, counting each call."""

    def __init__(self, store: Any, ops: Counter | None = None) -> None:
        self._store = store
        self.ops: Counter = ops if ops is not None else Counter()

    def _call(self, name: str, *args: Any) -> Any:
        self.ops[name] += 1
        self.ops["keys"] += len(args[0]) if isinstance(args[0], list) else 1  # the store's work
        self.ops["bytes_out"] += sum(_size(a) for a in args)
        result = getattr(self._store, name)(*args)
        if result is not None:
            self.ops["bytes_in"] += _size(result)
        return result

    def set(self, key: str, value: Any) -> None:
        return self._call("set", key, value)

    def get(self, key: str) -> bytes:
        return self._call("get", key)

    def add(self, key: str, value: int) -> int:
        return self._call("add", key, value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._call("compare_set", key, expected, desired)

    def check(self, keys: list[str]) -> bool:
        return self._call("check", keys)

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        return self._call("wait", keys) if timeout is None else self._call("wait", keys, timeout)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._call("multi_get", keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        return self._call("multi_set", keys, values)

    def set_timeout(self, timeout: Any) -> None:
        self._store.set_timeout(timeout)

    def clone(self) -> Counting:
        self.ops["connections"] += 1
        return Counting(self._store.clone(), self.ops)


ROUND_TRIPS = ("set", "get", "add", "compare_set", "check", "wait", "multi_get", "multi_set")


def total(counters: Iterable[Counter]) -> Counter:
    out: Counter = Counter()
    for c in counters:
        out.update(c)
    return out


def per_participant(ops: Counter, n: int) -> dict[str, float]:
    trips = sum(ops[k] for k in ROUND_TRIPS)
    return {"round_trips": trips / n, "keys": ops["keys"] / n, "bytes": (ops["bytes_out"] + ops["bytes_in"]) / n,
            **{k: ops[k] / n for k in ROUND_TRIPS if ops[k]}}
