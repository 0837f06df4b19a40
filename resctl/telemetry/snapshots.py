"""Which step each of a script's own `torch.save` snapshots holds, from the events.

A zero-edit script keeps its own snapshot (`torch.save(state, "snapshot.pt")`, often through a
temporary file and `os.replace`). The shim's tracker (`resctl.shim.snapshots`) records a
`snapshot` event when such a save returns, with the optimizer steps made so far. It becomes
durable:

- *observed* (a plain torch.save): when torch.save returned; `file_id` (device, inode, size,
  mtime) identifies the file, and a rename keeps all four, so a later `torch.load` of the renamed
  file is matched to the save;
- *intercepted* (`checkpoint.intercept_torch_save`): the interceptor's `ckpt_stall` with the same
  path came first on that rank; the write is durable at its `ckpt_persist` with that path (which
  may be recorded before or after the `snapshot` event). A write that failed never is; one that never got its
  `ckpt_persist` but that a restarted rank's `dcp.load` resumed at is, as of that load (`resume`).

`SnapshotLedger` turns the events into durable snapshots; `goodput` uses it for the report and
the shim's tracker for "which step did this `torch.load` restore".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Event = dict[str, Any]


@dataclass(frozen=True)
class Durable:
    """A snapshot that became durable: its step, when, how long the write took, its size."""

    rank: int
    step: int
    t: float
    seconds: float
    bytes: int | None
    intercepted: bool


class SnapshotLedger:
    """Feed events in each rank's file order; `feed` returns a `Durable` when one becomes durable.

    Memory: one entry per (rank, path) with a write in flight, plus (with `remember`) the step of
    every durable file identity and path, which the shim's tracker needs to answer `step_of`.
    """

    def __init__(self, remember: bool = False) -> None:
        self._inflight: dict[tuple[int, str], dict[str, Any]] = {}
        self._remember = remember
        self.by_file_id: dict[str, int] = {}
        self.by_path: dict[str, int] = {}

    def feed(self, e: Event) -> Durable | None:
        kind = e["kind"]
        if kind == "snapshot":
            return self._snapshot(e)
        if kind == "resume":
            return self._loaded(e)
        path = e.get("path")
        if path is None or kind not in ("ckpt_stall", "ckpt_persist"):
            return None
        key = (e["rank"], path)
        if kind == "ckpt_stall":  # the call began `seconds` before it returned
            self._inflight[key] = {"step": None, "persist": None, "began": e["t"] - (e.get("seconds") or 0.0)}
            return None
        slot = self._inflight.get(key)
        if slot is None:
            return None
        slot["persist"] = e
        return self._complete(key, slot)

    def _snapshot(self, e: Event) -> Durable | None:
        key = (e["rank"], e["path"])
        slot = self._inflight.get(key)
        if slot is not None and slot["step"] is None:  # intercepted: its ckpt_stall came first
            slot["step"] = e["step"]
            return self._complete(key, slot)
        if e["step"] is None:
            return None
        self._note(None, e.get("file_id"), e["step"])
        return Durable(e["rank"], e["step"], e["t"], e["seconds"], e.get("bytes"), intercepted=False)

    def _loaded(self, e: Event) -> Durable | None:
        """A `dcp.load` resumed this rank at a write of the path still without its `ckpt_persist` (an async save
        whose future never finished: the kill came in its closing collective, after `.metadata`): it was a whole
        checkpoint, since it was loaded, and counts among those made, durable as of the load."""
        if e.get("source") != "dcp.load" or e.get("path") is None:
            return None
        key = (e["rank"], e["path"])
        slot = self._inflight.get(key)
        if slot is None or slot["step"] is None or slot["step"] != e.get("step"):
            return None
        del self._inflight[key]
        self._note(key[1], None, slot["step"])
        return Durable(key[0], slot["step"], e["t"], 0.0, None, intercepted=True)

    def _complete(self, key: tuple[int, str], slot: dict[str, Any]) -> Durable | None:
        persist = slot["persist"]
        if persist is None or slot["step"] is None:
            return None
        del self._inflight[key]
        self._note(key[1], None, slot["step"])
        return Durable(key[0], slot["step"], persist["t"], persist["seconds"], persist.get("bytes"), intercepted=True)

    def _note(self, intercepted_path: str | None, file_id: str | None, step: int) -> None:
        if not self._remember:
            return
        if intercepted_path is not None:
            self.by_path[intercepted_path] = step
        if file_id is not None:
            self.by_file_id[file_id] = step

    def completed_since(self, path: str, written_at: float) -> int | None:
        """Step of the newest intercepted write of `path` still without its `ckpt_persist` that began at or
        before `written_at` (the wall time its completion mark was written: a DCP directory's `.metadata`,
        which rank 0 writes last); None when there is none. A `dcp.async_save` whose `.metadata` is written is
        complete even where its future never finished on this record: the kill of a rank in the collective that
        ends it (after the `.metadata` write) fails rank 0's future and keeps the others' waiting."""
        found = [(slot["began"], slot["step"]) for (_, p), slot in self._inflight.items()
                 if p == path and slot["step"] is not None and slot["began"] <= written_at]
        return max(found)[1] if found else None

    def step_of(self, path: str, file_id: str | None) -> int | None:
        """Step of the durable snapshot that is this file (same identity), else the newest durable
        intercepted write of this path; None when the run never wrote it."""
        if file_id is not None and file_id in self.by_file_id:
            return self.by_file_id[file_id]
        return self.by_path.get(path)


def file_id(st: Any) -> str:
    """`device:inode:size:mtime_ns` of an os.stat result (a rename keeps all four)."""
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
