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

A sharded save is collective: every rank calls `Saver.stage` for the same step (the engine's save),
which returns once this rank's shards are copied into host memory, and then `Saver.write`, which
the engine runs in its write queue's background thread when async (inline when not, e.g. the final
save). The copy is torch DCP's own stager (`DefaultStager`: a deep copy of the state whose host
storages are kept from one save to the next and, on a GPU, pinned and filled by non-blocking copies),
so a save after the first allocates nothing. The write is DCP's `save` of the staged copy on a gloo
process group of its own (made once per default group, at the first sharded save, by every rank), and
every collective of the write (DCP's plan exchange, the barriers, the verdict) runs on that group:
never interleaved with the training loop's collectives on the default group, whatever its backend.
Why not `dcp.async_save`: its future ends with DCP's write, but the checkpoint is not durable until
every rank's CRCs are gathered, the manifest is written and the directory is published, which need
the same group from the same background thread; and the engine's write queue (one write in flight,
the failed-save policy, `wait()`, the final synchronous save) is the one place a write runs.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from resctl.checkpoint import format as fmt
from resctl.checkpoint import state as st
from resctl.checkpoint.staging import Staging

DCP_METADATA = ".metadata"
SHARD_RE = re.compile(r"^__(\d+)_(\d+)\.distcp$")
CRC_FILE = "shard-crcs-rank{rank}.json"
MEMO_KEY = "sharded-wrappers"  # this module's entry in a memory-tier slot's memo


def _flat(tensors: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"t{i}": t for i, t in enumerate(tensors)}


@dataclass(frozen=True)
class Staged:
    """One rank's part of a sharded save, staged: the host copy of its tensors (DCP's flat dict),
    the encoded containers and plain values, and the group the write's collectives use."""

    step: int
    flat: dict[str, Any]
    meta: bytes
    group: Any
    #: Why this rank could not stage (it still takes part in the write's collectives, which then fail on every rank).
    failed: str | None = None


@dataclass(frozen=True)
class FromSnapshot:
    """A memory-tier snapshot of the state at the step being saved (`memory.Snapshot`): a sharded save
    writes its bytes, no second copy. `memo`: its slot's `Slot.memo` (dropped when the slot is remapped)."""

    data: torch.Tensor  # the slot's stream bytes
    specs: list[fmt.TensorSpec]
    memo: dict[str, Any]


class Saver:
    """The sharded saves of one `Checkpointer`: the staging arena, the staged tensors kept between
    saves of the same layout, and the write's process group."""

    def __init__(self) -> None:
        self._staging = Staging("host")
        self._wrapped: tuple[Any, list[torch.Tensor]] | None = None  # (layout, staged tensors)
        self._stager: Any = None  # DCP's, for a state with ShardedTensor values
        self._meta = st.MetaEncoder()
        self._group: Any = None
        self._world: Any = None

    def _group_for_writes(self) -> Any:
        """A gloo group over the whole world, made once per default group (collective: every rank
        reaches it at the same save). A new default group (an in-process restart) gets a new one."""
        world = dist.group.WORLD
        if self._group is None or self._world is not world:
            self._group = dist.new_group(backend="gloo")
            self._world = world
        return self._group

    def _stage_dtensors(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copy each tensor's local part (a DTensor's shard, a plain tensor) into the host arena in
        one `_foreach_copy_` (pinned and non-blocking from a GPU), and return them as DCP will write
        them: DTensors over the arena's views with the sources' mesh, placements and global shape."""
        from torch.distributed.tensor import DTensor

        local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        specs, total = fmt.plan_stream(local)
        self._staging.stage(local, total, specs=specs)
        views = self._staging.views()
        left = iter(views)
        placed = [next(left) if spec.nbytes else torch.empty(spec.shape, dtype=t.dtype) for t, spec in zip(local, specs)]
        layout = (id(views), _layout(tensors))
        if self._wrapped is not None and self._wrapped[0] == layout:
            return self._wrapped[1]
        staged = _wrap(tensors, placed)
        self._wrapped = (layout, staged)
        return staged

    def _from_snapshot(self, tensors: list[torch.Tensor], snap: FromSnapshot) -> list[torch.Tensor] | None:
        """The state's tensors as DCP writes them, over `snap`'s bytes (no copy); None when the snapshot's
        layout is not the state's. The wrappers stay in the slot's memo: a later save from the same slot
        with the same layout builds none (each is a `DTensor.from_local`: ~half the save call's time for
        a few hundred small tensors, docs/BENCHMARKS.md)."""
        key = (snap.data.data_ptr(), snap.data.numel(), _layout(tensors))
        kept = snap.memo.get(MEMO_KEY)
        if kept is not None and kept[0] == key and kept[1] == snap.specs:
            return list(kept[2])
        if not _fits(snap.specs, tensors):
            return None
        wrapped = _wrap(tensors, _views(snap.data, snap.specs))
        snap.memo[MEMO_KEY] = (key, list(snap.specs), wrapped)
        return list(wrapped)

    def _stage_with_dcp(self, flat: dict[str, torch.Tensor]) -> dict[str, Any]:
        """ShardedTensor (FSDP1's sharded state dict): DCP's own stager (storages kept between saves)."""
        if self._stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            gpu = torch.cuda.is_available() and any(t.device.type == "cuda" for t in flat.values())
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=gpu, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=gpu))
        staged = self._stager.stage(flat)
        assert isinstance(staged, dict)
        return staged

    def stage(self, entries: dict[str, Any], stateful: list[str], step: int,
              snapshot: FromSnapshot | None = None) -> Staged:
        """Collective (the first time): copy this rank's shards of `entries` to host memory. The
        training loop may change the state as soon as this returns. `snapshot`: a memory-tier snapshot
        of this state at this step (each DTensor's local part, in flatten order): written from there, no
        second copy, when its layout is the state's."""
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("sharded (DTensor) state needs an initialised torch.distributed process group")
        group = self._group_for_writes()
        try:
            tensors: list[torch.Tensor] = []
            structure = st.flatten(entries, tensors, {}, sharded_ok=True)
            meta = self._meta.encode(step, structure, stateful)
            with torch.no_grad():
                if any(type(t).__name__ == "ShardedTensor" for t in tensors):
                    flat = self._stage_with_dcp(_flat(tensors))
                else:
                    kept = self._from_snapshot(tensors, snapshot) if snapshot is not None else None
                    flat = _flat(kept if kept is not None else self._stage_dtensors(tensors))
        except Exception as err:  # noqa: BLE001 - the other ranks' writes wait for this one's collectives
            return Staged(step, {}, b"", group, failed=f"{type(err).__name__}: {err}")
        return Staged(step, flat, meta, group)

    def close(self) -> None:
        if self._stager is not None:
            self._stager.close()
            self._stager = None


def _layout(tensors: list[torch.Tensor]) -> tuple[Any, ...]:
    """What the wrappers of staged views depend on: each DTensor's mesh, placements, global shape, stride and
    dtype (its local shape follows), each other tensor's shape and dtype."""
    from torch.distributed.tensor import DTensor

    return tuple((id(t.device_mesh), t.placements, t.shape, t.stride(), t.dtype) if isinstance(t, DTensor)
                 else (t.shape, t.dtype) for t in tensors)


def _fits(specs: list[fmt.TensorSpec], tensors: list[torch.Tensor]) -> bool:
    """A snapshot's layout is the state's: one spec per tensor, each of its local part's dtype and shape."""
    return len(specs) == len(tensors) and all(spec.dtype == fmt.dtype_name(t.dtype) and
                                              spec.shape == tuple(st.local_part(t).shape) for spec, t in zip(specs, tensors))


def _views(data: torch.Tensor, specs: list[fmt.TensorSpec]) -> list[torch.Tensor]:
    """The tensors of a stream's bytes (a memory-tier slot), without a copy."""
    return [data.narrow(0, spec.offset, spec.nbytes).view(fmt.dtype_from_name(spec.dtype)).view(spec.shape)
            if spec.nbytes else torch.empty(spec.shape, dtype=fmt.dtype_from_name(spec.dtype)) for spec in specs]


def _wrap(tensors: list[torch.Tensor], local: list[torch.Tensor]) -> list[torch.Tensor]:
    """`local[i]` as DCP writes it: a DTensor over that very host view with `tensors[i]`'s spec (mesh, placements,
    global shape and stride) when that one is a DTensor, else as it is. Built as FSDP2 builds its own sharded
    parameters (`DTensor(local, spec)`), not with `DTensor.from_local`, which moves a local tensor to the mesh's
    device: on a GPU that made a device copy of the rank's whole state at each wrap (0.14 s of a 6.4 GB save's
    stall on an H100, and its memory), and the wrappers kept for the next save held that copy, not the view."""
    from torch.distributed.tensor import DTensor

    return [DTensor(v, t._spec, requires_grad=False) if isinstance(t, DTensor) else v for t, v in zip(tensors, local)]


def write(
    root: Path,
    staged: Staged,
    *,
    writers: int,
    beat: Callable[..., None],
    publish: Callable[[Path, int], Path],
    run_id: str = "",
    fail: str | None = None,
) -> int | None:
    """Collective on `staged.group`: write this rank's staged shards as checkpoint `staged.step`.
    Rank 0 writes the manifest and publishes; it returns the checkpoint's bytes, other ranks None.
    A failure on any rank (`fail`: a fault drill's) raises on every rank, after the last collective."""
    import torch.distributed.checkpoint as dcp

    group, step = staged.group, staged.step
    rank = dist.get_rank(group)
    # One deterministic temp name: every rank writes into the same directory.
    tmp = root / f".tmp-{fmt.step_dir_name(step)}-dcp"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier(group=group)
    beat(force=True)
    writer = dcp.FileSystemWriter(str(tmp), thread_count=writers, sync_files=True)
    dcp.save(staged.flat, storage_writer=writer, process_group=group)
    # dcp.save returns once every rank's shards are written (fsynced) and rank 0 wrote .metadata.
    fail = fail or staged.failed
    error: BaseException | None = RuntimeError(fail) if fail else None
    if error is None:
        try:
            _write_own_crcs(tmp, rank, writers)
        except Exception as err:  # noqa: BLE001 - reported on every rank below
            error = err
    # Every rank's shards and checksums are durable before rank 0 publishes, or nobody publishes.
    every_rank_wrote = _min_over(group, 0 if error is not None else 1) == 1
    total: int | None = None
    if rank == 0 and every_rank_wrote:
        try:
            total = _finish(tmp, staged.meta, step, dist.get_world_size(group), run_id)
            publish(tmp, step)
        except Exception as err:  # noqa: BLE001
            error = err
    if rank == 0 and (error is not None or not every_rank_wrote):
        shutil.rmtree(tmp, ignore_errors=True)
    if _min_over(group, 0 if error is not None else 1) == 0 or not every_rank_wrote:
        raise error if error is not None else RuntimeError("another rank failed to write its shards (see its log)")
    return total


def _min_over(group: Any, value: int) -> int:
    flag = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return int(flag.item())


def _write_own_crcs(tmp: Path, rank: int, threads: int) -> None:
    """This rank's shard files checksummed (from the page cache, one thread a file: zlib releases the GIL)."""
    own = [p for p in tmp.iterdir() if (m := SHARD_RE.match(p.name)) and int(m.group(1)) == rank]
    with ThreadPoolExecutor(max(1, min(threads, len(own))), thread_name_prefix="resctl-crc") as pool:
        sums = list(pool.map(fmt.file_crc, own))
    crcs = {p.name: [size, crc] for p, (size, crc) in zip(own, sums)}
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


__all__ = ["Saver", "Staged", "write", "verify"]
