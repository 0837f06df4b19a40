"""The disk half of a load: walk the candidates newest first, verify each on every rank, and restore
the newest that every rank can read (the engine's `load` decides between this and the memory tier,
and records what was resumed). A damaged candidate is rejected (`Disk.reject`: reported and
quarantined); one that does not fit the state raises `CheckpointMismatch` on every rank.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, MutableMapping

from resctl.checkpoint import collectives, rankside, shardtargets
from resctl.checkpoint import state as st
from resctl.checkpoint.disk import Disk
from resctl.checkpoint.errors import CheckpointMismatch

if TYPE_CHECKING:
    from resctl.checkpoint.reader import Verified


def from_disk(disk: Disk, state: MutableMapping[str, Any], candidates: list[tuple[int, Path]], distributed: bool,
              rank: int, world_size: int) -> tuple[int, Verified] | None:
    """(step, what was verified) of the candidate restored into `state`; None: no candidate fits."""
    for step, path in candidates:
        verified, verdict, problem = disk.verify(path, step, state, rank, world_size)
        own: dict[str, Any] = {}
        if verified is not None:
            verdict, problem, own = own_entries(disk.dir, verified, state, rank, world_size)
        if distributed:
            verdict = collectives.min_over_ranks(verdict)
        if verdict == collectives.MISMATCH:
            raise problem if isinstance(problem, CheckpointMismatch) else CheckpointMismatch(
                f"checkpoint step {step} in {disk.dir} does not fit the state on another rank (see that rank's log)")
        if verdict == collectives.SKIP or verified is None:
            disk.reject(step, path, problem)
            continue
        if verified.manifest.kind == "dcp":
            shardtargets.load_into(path, verified.meta, state)  # targets by path: a fresh optimizer has no state
            st.restore(state, own, list(verified.meta["stateful"]))  # this rank's own data position, not rank 0's
        else:
            st.restore(state, verified.entries or {}, list(verified.meta["stateful"]))
        return step, verified
    return None


def own_entries(root: Path, verified: Verified, state: MutableMapping[str, Any], rank: int,
                world_size: int) -> tuple[int, Exception | None, dict[str, Any]]:
    """This rank's own per-rank entries of a verified checkpoint (`rankside.take`), put in place of
    rank 0's (a plain one's entries; a sharded one's are returned, for after its collective load);
    the verdict is SKIP when this rank's are damaged or missing."""
    saved = verified.entries if verified.entries is not None else verified.meta.get("entries", {})
    names = [n for n in rankside.names(state) if n in saved]
    if not names or not rank:
        return collectives.OK, None, {}
    try:
        own = rankside.take(root, rank, verified.step, world_size=world_size, manifest=verified.manifest)
    except (rankside.RankEntriesDamaged, rankside.RankEntriesMissing) as err:
        return collectives.SKIP, err, {}
    mine = {n: own[n] for n in names if n in own} if own is not None else {}
    if verified.entries is not None:
        verified.entries.update(mine)
    return collectives.OK, None, mine
