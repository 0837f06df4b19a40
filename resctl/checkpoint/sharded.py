"""Sharded state (DTensor / FSDP2, ShardedTensor): every rank writes its own shards through
torch.distributed.checkpoint (DCP); nothing is gathered on rank 0.

Layout of a sharded checkpoint (same atomic rules as the plain one)::

    step-000000100/
      __0_0.distcp, __1_0.distcp, ...   DCP shard files, each written and fsynced by its rank
      .metadata                         DCP's global metadata (written by rank 0)
      meta.pt                           containers and plain values of the state (weights_only)
      manifest.json                     written last by rank 0: every file's size, CRC32 of
                                        meta.pt and .metadata

Only tensors go through DCP (as a flat dict `{"t0": ..., "t1": ...}`); plain values stay in
meta.pt so they are never unpickled by DCP (whose planner loads non-tensor values with
`weights_only=False`). DCP itself unpickles `.metadata`; resctl verifies its CRC32 against the
manifest first, and only for a sharded state (a plain state never reads a DCP checkpoint).
Every shard file has a CRC32 too: after `dcp.save` each rank checksums the files it wrote
(`__<rank>_<n>.distcp`, just written, so from the page cache) and hands them to rank 0 through a
small file in the temp directory. On load, rank r verifies the shards written by the ranks w with
`w % world_size == r` (its own when the world size is unchanged); the engine's all-reduce of
every rank's verdict then makes one damaged shard move every rank back one checkpoint.

A sharded save is collective and synchronous in this version: every rank must call `save` for
the same step; the call returns once the checkpoint is published (async DCP needs its own
process group so its collectives never interleave with training's; left for later).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path
from typing import Any, Callable, MutableMapping

import torch
import torch.distributed as dist

from resctl.checkpoint import collectives
from resctl.checkpoint import format as fmt
from resctl.checkpoint import state as st

DCP_METADATA = ".metadata"
SHARD_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
CRC_FILE = "shard-crcs-rank{rank}.json"


def _flat(tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"t{i}": t for i, t in enumerate(tensors)}


def save(
    root: Path,
    entries: dict[str, Any],
    stateful: list[str],
    step: int,
    *,
    writers: int,
    beat: Callable[..., None],
    publish: Callable[[Path, int], Path],
    run_id: str = "",
) -> int | None:
    """Collective: write this rank's shards of `entries` as checkpoint `step`. Rank 0 writes the
    manifest and publishes; it returns the checkpoint's bytes, other ranks None. A failure on any
    rank raises on every rank (after the last collective, so nobody waits forever)."""
    import torch.distributed.checkpoint as dcp

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("sharded (DTensor) state needs an initialised torch.distributed process group")
    rank = dist.get_rank()
    tensors: list[torch.Tensor] = []
    structure = st.flatten(entries, tensors, {}, sharded_ok=True)
    meta = st.encode_meta({"step": step, "entries": structure, "stateful": stateful})
    # One deterministic temp name: every rank writes into the same directory.
    tmp = root / f".tmp-{fmt.step_dir_name(step)}-dcp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    beat(force=True)
    dcp.save(_flat(tensors), storage_writer=dcp.FileSystemWriter(str(tmp), thread_count=writers, sync_files=True))
    # dcp.save returns once every rank's shards are written (fsynced) and rank 0 wrote .metadata.
    error: BaseException | None = None
    try:
        _write_own_crcs(tmp, rank)
    except Exception as err:  # noqa: BLE001 - reported on every rank below
        error = err
    dist.barrier()
    total: int | None = None
    if rank == 0 and error is None:
        try:
            total = _finish(tmp, meta, step, dist.get_world_size(), run_id)
            publish(tmp, step)
        except Exception as err:  # noqa: BLE001
            error = err
            shutil.rmtree(tmp, ignore_errors=True)
    if collectives.min_over_ranks(0 if error is not None else 1) == 0:
        raise error if error is not None else RuntimeError("another rank failed to write its shards (see its log)")
    return total


def _write_own_crcs(tmp: Path, rank: int) -> None:
    crcs = {}
    for p in tmp.iterdir():
        m = SHARD_RE.match(p.name)
        if m and int(m.group(1)) == rank:
            size, crc = fmt.file_crc(p)
            crcs[p.name] = [size, crc]
    (tmp / CRC_FILE.format(rank=rank)).write_text(json.dumps(crcs))


def _finish(tmp: Path, meta: bytes, step: int, world_size: int, run_id: str) -> int:
    """Rank 0: meta.pt, the shard checksums gathered from every rank, the manifest."""
    meta_size, meta_crc = fmt.write_file(tmp / fmt.META, [memoryview(meta)])
    files = {fmt.META: fmt.FileEntry(meta_size, meta_crc)}
    crcs: dict[str, list[int]] = {}
    for r in range(world_size):
        side = tmp / CRC_FILE.format(rank=r)
        crcs.update(json.loads(side.read_text()))
        side.unlink()
    for p in sorted(tmp.iterdir()):
        if p.name in (fmt.META, fmt.MANIFEST):
            continue
        size = p.stat().st_size
        if p.name == DCP_METADATA:
            files[p.name] = fmt.FileEntry(size, fmt.file_crc(p)[1])
        elif p.name in crcs and crcs[p.name][0] == size:
            files[p.name] = fmt.FileEntry(size, crcs[p.name][1])
        else:
            files[p.name] = fmt.FileEntry(size)
    manifest = fmt.Manifest("dcp", step, files, created=time.time(), world_size=world_size, run_id=run_id)
    fmt.write_manifest(tmp / fmt.MANIFEST, manifest)
    fmt.fsync_dir(tmp)
    return sum(e.bytes for e in files.values())


def verify(path: Path, manifest: fmt.Manifest, rank: int, world_size: int) -> None:
    """Checks beyond sizes (done by the reader): CRC32 of DCP's pickled .metadata (before DCP
    unpickles it), and of the shard files this rank answers for (see the module docstring)."""
    info = manifest.files.get(DCP_METADATA)
    if info is None or info.crc32 is None:
        raise fmt.CorruptCheckpoint("sharded checkpoint without a checksummed DCP .metadata")
    if fmt.file_crc(path / DCP_METADATA)[1] != info.crc32:
        raise fmt.CorruptCheckpoint(".metadata: checksum mismatch")
    for name, entry in manifest.files.items():
        m = SHARD_RE.match(name)
        if m is None or entry.crc32 is None or int(m.group(1)) % max(world_size, 1) != rank:
            continue
        if fmt.file_crc(path / name)[1] != entry.crc32:
            raise fmt.CorruptCheckpoint(f"{name}: checksum mismatch")


def load_into(path: Path, meta: dict[str, Any], state: MutableMapping[str, Any]) -> None:
    """Collective: load this rank's shards into `state` in place."""
    import torch.distributed.checkpoint as dcp

    entries_now, _ = st.snapshot_entries(state)
    targets: list[torch.Tensor] = []
    st.flatten(entries_now, targets, {}, sharded_ok=True)
    dcp.load(_flat(targets), storage_reader=dcp.FileSystemReader(str(path)))
    entries = st.unflatten(meta["entries"], targets)
    st.restore(state, entries, list(meta["stateful"]))


__all__ = ["save", "load_into", "verify"]
