"""The entries of a plain checkpoint that differ per rank (a data loader's position), one small file
per rank beside it.

A plain checkpoint is rank 0's copy of replicated state, written by rank 0 alone. An entry whose
type says `resctl_per_rank = True` (`dataposition`'s loader and zero-edit entries) differs per rank:
an IterableDataset sharded by rank, a sampler with a generator seeded by rank, a rank-seeded global
RNG. Rank 0's is in the checkpoint; every other rank R writes its own in its `save` of step N, to
`<dir>/.ranks/rank-<R>/step-<N>.pt` (written aside and renamed over at once, fsynced in the background;
CRC32 in a trailer), and on a load of step N takes it instead of rank 0's. No collective at save time:
a script that saves on rank 0 only must not hang; and the file is in place before `save` returns, so
a rank killed a step later still has it (rank 0's write of N is still in flight then).

A load of step N on rank R > 0 (`take`, one verdict that joins the ranks' MIN in the engine):

- the checkpoint was written by another world size: rank 0's record (a DistributedSampler
  re-splits by the job's sample count; other samplers refuse, `dataposition`);
- rank R's file for N is intact, of this rank and world size: it replaces rank 0's entries;
- it is damaged: it is removed and step N is skipped by every rank (the next older one loads);
- it is missing while rank R holds a file of an older step of the same run and world size (it was
  saving, and died before it saved N): skipped the same way;
- it is missing otherwise (the script saves on rank 0 only): rank 0's record, as before.

Rank R removes its files older than the oldest visible checkpoint after each save, and those newer
than the step it resumed (an abandoned timeline) at each load.
"""

from __future__ import annotations

import os
import re
import secrets
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from resctl.checkpoint import format as fmt
from resctl.checkpoint import state as st

DIR = ".ranks"
_MAGIC = b"RSCLRANK"
_TRAILER = struct.Struct("<8sI")
_FILE_RE = re.compile(r"^step-(\d+)\.pt$")


class RankEntriesDamaged(Exception):
    """This rank's file for a step is unreadable (not `CorruptCheckpoint`: rank 0's checkpoint is fine
    and must not be quarantined for it)."""


class RankEntriesMissing(Exception):
    """This rank saved its own entries in this run but not for this step (it stopped before)."""


def names(state: Mapping[str, Any]) -> list[str]:
    """The per-rank entries of a state (asked on the type: a module's `__getattr__` is slow)."""
    return [str(k) for k, v in state.items() if getattr(type(v), "resctl_per_rank", False)]


def rank_dir(root: Path, rank: int) -> Path:
    return root / DIR / f"rank-{rank}"


def encode(entries: Mapping[str, Any], *, step: int, rank: int, world_size: int, run_id: str) -> bytes:
    body = st.encode_meta({"step": step, "rank": rank, "world_size": world_size, "run_id": run_id,
                           "entries": dict(entries)})
    return body + _TRAILER.pack(_MAGIC, zlib.crc32(body))


def decode(data: bytes) -> dict[str, Any]:
    """A file's content, checked (raises RankEntriesDamaged)."""
    if len(data) < _TRAILER.size:
        raise RankEntriesDamaged("truncated")
    body, (magic, crc) = data[: -_TRAILER.size], _TRAILER.unpack(data[-_TRAILER.size:])
    if magic != _MAGIC or zlib.crc32(body) != crc:
        raise RankEntriesDamaged("checksum mismatch")
    try:
        rec = st.decode_meta(body)
    except Exception as err:  # noqa: BLE001 - any failure to decode is damage
        raise RankEntriesDamaged(f"{type(err).__name__}: {err}") from None
    if not isinstance(rec.get("entries"), dict):
        raise RankEntriesDamaged("not a rank-entries record")
    return rec


def write_entries(root: Path, entries: Mapping[str, Any], names: list[str], *, step: int, rank: int,
                  world_size: int, run_id: str) -> Path:
    """`encode` the entries `names` of `entries` and `write` them as rank `rank`'s file of `step`."""
    data = encode({n: entries[n] for n in names}, step=step, rank=rank, world_size=world_size, run_id=run_id)
    return write(root, rank, step, data)


def write(root: Path, rank: int, step: int, data: bytes) -> Path:
    """Write `data` as rank `rank`'s file of `step`, aside then renamed over, not yet fsynced (`sync`).

    In the page cache it survives the process being killed, so a rank killed right after its save
    still has it; a node that goes down before `sync` may lose it or leave it torn, which a load reads
    as missing or damaged (the step before loads)."""
    where = rank_dir(root, rank)
    where.mkdir(parents=True, exist_ok=True)
    final = where / f"step-{step:09d}.pt"
    tmp = where / f".tmp-{final.name}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        tmp.write_bytes(data)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return final


def sync(path: Path) -> None:
    """Make a written file durable: fsync it and its directory."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    fmt.fsync_dir(path.parent)


def steps(root: Path, rank: int) -> list[tuple[int, Path]]:
    """Rank `rank`'s files as (step, path), newest first."""
    try:
        entries = list(os.scandir(rank_dir(root, rank)))
    except FileNotFoundError:
        return []
    found = [(int(m.group(1)), Path(e.path)) for e in entries if (m := _FILE_RE.match(e.name))]
    return sorted(found, reverse=True)


def take(root: Path, rank: int, step: int, *, world_size: int, manifest: fmt.Manifest) -> dict[str, Any] | None:
    """Rank `rank`'s own entries of checkpoint `step` (None: keep rank 0's); raises RankEntriesDamaged
    or RankEntriesMissing when the step must be skipped (see the module docstring)."""
    if rank == 0 or manifest.world_size != world_size:
        return None
    mine = steps(root, rank)
    path = next((p for s, p in mine if s == step), None)
    if path is not None:
        try:
            rec = decode(path.read_bytes())
            if (rec.get("step"), rec.get("rank"), rec.get("world_size")) != (step, rank, world_size):
                raise RankEntriesDamaged(f"written for step {rec.get('step')} rank {rec.get('rank')} "
                                         f"world size {rec.get('world_size')}")
        except (OSError, RankEntriesDamaged) as err:
            path.unlink(missing_ok=True)
            raise RankEntriesDamaged(f"rank {rank}'s own entries of step {step} ({path}) are damaged ({err}); "
                                     "removed") from None
        return dict(rec["entries"])
    for s, p in mine:
        if s >= step:
            continue
        try:
            rec = decode(p.read_bytes())
        except (OSError, RankEntriesDamaged):
            continue
        if rec.get("run_id") == manifest.run_id and rec.get("world_size") == world_size:
            raise RankEntriesMissing(f"rank {rank} saved its own entries in this run (step {s}) but not for "
                                     f"step {step}: it stopped before that save")
    return None


def prune(root: Path, rank: int) -> None:
    """Remove this rank's files older than the oldest visible checkpoint."""
    visible = fmt.list_step_dirs(root)
    if not visible:
        return
    oldest = visible[-1][0]
    for s, p in steps(root, rank):
        if s < oldest:
            p.unlink(missing_ok=True)


def forget_newer(root: Path, rank: int, step: int) -> None:
    """The job resumed from `step`: this rank's files of later steps are an abandoned timeline."""
    for s, p in steps(root, rank):
        if s > step:
            p.unlink(missing_ok=True)
