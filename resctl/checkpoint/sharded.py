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
manifest first. Shard files are checked by size only (a CRC would need every rank to read its
shards back, or rank 0 to read everyone's).

A sharded save is collective and synchronous in this version: every rank must call `save` for
the same step; the call returns once the checkpoint is published (async DCP needs its own
process group so its collectives never interleave with training's; left for later).
"""

from __future__ import annotations

import shutil
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, MutableMapping

import torch
import torch.distributed as dist

from resctl.checkpoint import format as fmt
from resctl.checkpoint import state as st

if TYPE_CHECKING:
    from resctl.checkpoint.engine import Checkpointer

DCP_METADATA = ".metadata"


def _flat(tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"t{i}": t for i, t in enumerate(tensors)}


def save(ckpt: "Checkpointer", entries: dict[str, Any], stateful: list[str], step: int) -> None:
    """Collective: write this rank's shards of `entries` as checkpoint `step`."""
    import torch.distributed.checkpoint as dcp

    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("sharded (DTensor) state needs an initialised torch.distributed process group")
    t0 = time.monotonic()
    rank = dist.get_rank()
    tensors: list[torch.Tensor] = []
    structure = st.flatten(entries, tensors, {}, sharded_ok=True)
    meta = st.encode_meta({"step": step, "entries": structure, "stateful": stateful})
    # One deterministic temp name: every rank writes into the same directory.
    tmp = ckpt.dir / f".tmp-{fmt.step_dir_name(step)}-dcp"
    if rank == 0:
        ckpt.dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()
    ckpt._beat(force=True)
    dcp.save(_flat(tensors), storage_writer=dcp.FileSystemWriter(str(tmp), thread_count=ckpt.writers, sync_files=True))
    # dcp.save returns on rank 0 after every rank's write results were gathered, so all shards are durable.
    if rank == 0:
        try:
            meta_size, meta_crc = fmt.write_file(tmp / fmt.META, [memoryview(meta)])
            files: dict[str, dict[str, Any]] = {fmt.META: {"bytes": meta_size, "crc32": meta_crc}}
            for p in sorted(tmp.iterdir()):
                if p.name in (fmt.META, fmt.MANIFEST):
                    continue
                info: dict[str, Any] = {"bytes": p.stat().st_size}
                if p.name == DCP_METADATA:
                    info["crc32"] = fmt.file_crc(p)[1]
                files[p.name] = info
            body = {
                "format": fmt.FORMAT,
                "version": fmt.VERSION,
                "kind": "dcp",
                "step": step,
                "created": time.time(),
                "world_size": dist.get_world_size(),
                "files": files,
            }
            fmt.write_manifest(tmp / fmt.MANIFEST, body)
            fmt.fsync_dir(tmp)
            ckpt.publish(tmp, step)
            ckpt.prune(recycle=False)  # only the plain writer overwrites recycled files
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        total = sum(int(i["bytes"]) for i in files.values())
        ckpt.events.emit("ckpt_persist", step=step, seconds=round(time.monotonic() - t0, 6), bytes=total)
    dist.barrier()


def verify(path: Path, body: dict[str, Any]) -> None:
    """Checks beyond sizes (done by the engine): CRC32 of DCP's pickled .metadata."""
    info = body["files"].get(DCP_METADATA)
    if info is None:
        raise fmt.CorruptCheckpoint("sharded checkpoint without DCP .metadata")
    if zlib.crc32((path / DCP_METADATA).read_bytes()) != info.get("crc32"):
        raise fmt.CorruptCheckpoint(".metadata: checksum mismatch")


def load_into(ckpt: "Checkpointer", path: Path, payload: tuple[dict[str, Any], dict[str, Any]], state: MutableMapping[str, Any]) -> None:
    """Collective: load this rank's shards into `state` in place."""
    import torch.distributed.checkpoint as dcp

    _, meta = payload
    entries_now, _ = st.snapshot_entries(state)
    targets: list[torch.Tensor] = []
    st.flatten(entries_now, targets, {}, sharded_ok=True)
    dcp.load(_flat(targets), storage_reader=dcp.FileSystemReader(str(path)))
    entries = st.unflatten(meta["entries"], targets)
    st.restore(state, entries, list(meta["stateful"]))


__all__ = ["save", "load_into", "verify"]
