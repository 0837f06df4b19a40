"""The memory tier: snapshots of the state in host shared memory that outlive the worker process.

`checkpoint.memory_every = N` makes `maybe_save` snapshot the state every N steps into
`/dev/shm/resctl-<job>/rank-<R>/` (see `memdir` for the layout and who removes it). A killed or
restarted worker finds the snapshot there and restores it at memory speed; the disk checkpoints
every `interval_steps` stay the fallback (and are written *from* a memory snapshot: the state is
copied out of the device once).

**Double buffering.** Each rank has two slots, each a checkpoint directory in the disk format
(`data-0.bin` holding the stream, `meta.pt`, `manifest.json`). A snapshot goes into the slot that
does *not* hold the newest complete one: its manifest is removed first, the stream is copied into
the (preallocated, mapped) data file, and in the background the data is checksummed and
`meta.pt` and the manifest are written, the manifest by an atomic rename. A slot is complete
exactly when its manifest exists, so a kill at any moment leaves the previous snapshot complete
and the one being written without a manifest: a torn snapshot is never offered.

**Verification.** A load checks the manifest (its own checksum, kind, layout), the sizes,
`meta.pt`'s checksum and weights_only decoding, the fit to the state and the checksum of every
data byte before the state changes (`verify`), like a disk checkpoint. The memory tier's checksum
is CRC32C (hardware-accelerated, ~13 GB/s on one core here) when the `crc32c` module is present,
else zlib's CRC32; the manifest names which.

**Restore.** `restore` copies the verified stream straight into the state's existing tensors where
shape and dtype match (a module's parameters: warm memory, no allocation), and into new tensors
otherwise (e.g. an optimizer's state after a restart), then hands them to `load_state_dict`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import mmap
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

import torch

from resctl.checkpoint import format as fmt
from resctl.checkpoint import memdir, reader, replica, shardtargets, slots, upload
from resctl.checkpoint import state as st
from resctl.checkpoint.crc import CHECKSUM, checksum, checksum_of
from resctl.checkpoint.errors import CheckpointMismatch
from resctl.checkpoint.replica import Replicator
from resctl.checkpoint.replica_wire import WireError
from resctl.checkpoint.shmslot import DATA, Slot, bytes_of, map_snapshot, release_pages, unmap
from resctl.telemetry.events import NULL_LOG, EventLog

log = logging.getLogger("resctl.checkpoint.memory")
THREADS = max(1, min(8, os.cpu_count() or 1))

#: The engine's `_stage`: (tensors, total, buffer or None for its own arena, layout) -> staged bytes.
StageFn = Callable[[list[torch.Tensor], int, "torch.Tensor | None", list[fmt.TensorSpec]], torch.Tensor]


@dataclass
class Snapshot:
    """A memory snapshot just staged: a disk save of the same step writes from `view`."""

    step: int
    slot: int
    view: torch.Tensor  # the slot's stream bytes (uint8, CPU, shared memory)
    specs: list[fmt.TensorSpec]
    total: int
    meta: bytes
    #: Done when the snapshot is committed (a disk write from `view` waits for it: with device
    #: staging the bytes reach `view` in the background).
    ready: Future[None] | None = None
    #: The slot's `Slot.memo` (kept while the slot stays mapped as it is).
    memo: dict[str, Any] = field(default_factory=dict)


@dataclass
class Verified:
    """A slot that passed every check (`MemoryTier.verify`); `restore` puts it into the state."""

    step: int
    slot: int
    manifest: fmt.Manifest
    meta: dict[str, Any]
    data: mmap.mmap | None
    #: The snapshot's tensors, already on their devices (a CUDA state with room for them: the
    #: checksum was computed while they were uploaded), in manifest order; None: `restore` copies.
    staged: list[torch.Tensor] | None = None
    #: A sharded snapshot's targets by tensor index (`_sharded_targets`); None: paired by `restore`.
    targets: dict[int, torch.Tensor] | None = None


class MemoryTier:
    """One rank's two slots in host shared memory (see the module docstring)."""

    def __init__(self, key: str, rank: int, *, run_id: str = "", events: EventLog | None = None,
                 root: Path | None = None) -> None:
        self.key = key
        self.rank = rank
        self.run_id = run_id
        self.root = root
        self.dir = memdir.rank_dir(key, rank, root)
        self.events = events if events is not None else NULL_LOG
        self._slots = [Slot(self.dir / f"slot-{k}") for k in range(slots.SLOTS)]
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="resctl-mem")
        self._crc_pool = ThreadPoolExecutor(THREADS, thread_name_prefix="resctl-mem-crc")
        self._commit: Future[None] | None = None  # the newest commit (commits run one at a time, in order)
        self._arena_free = threading.Event()  # no commit is reading the engine's device arena
        self._arena_free.set()
        self._warming: Future[None] | None = None  # slots being mapped and pinned in the background
        self._pins: slots.Claims[Future[Any]] = slots.Claims()  # readers of a slot (disk writes, refills)
        self._last: int | None = None  # the slot written last (the next snapshot goes to the other)
        self._gate: Any = None  # the forward pre-hook holding the next step until the commit lands
        self._held = 0.0  # seconds forwards were held since the last snapshot (`hold_if_committing`)
        self._stream: Any = None  # CUDA stream of the background device-to-host copies
        #: Why the tier was turned off in this process (a failed snapshot), or None.
        self.disabled: str | None = None
        #: Sends committed snapshots to the buddy node (`replicate_to`); None: not replicated.
        self.replicator: Replicator | None = None

    # --- saving --------------------------------------------------------------------------------

    def save(self, tensors: list[torch.Tensor], structure_meta: bytes, step: int, stage: StageFn,
             on_device: bool = False) -> tuple[Snapshot, float]:
        """Copy `tensors` into the free slot (blocking: the caller may change them afterwards) and
        commit it in the background; return the snapshot and the seconds waited for the previous
        commit or a disk write still reading the slot.

        CUDA tensors are copied into the slot directly (registered with CUDA as pinned memory, so
        at the device-to-host copy's full speed); with `on_device` (checkpoint.stage = "device")
        they are copied into a spare device buffer instead (`stage` with no buffer given) and the
        background commit copies that to the slot: the loop is blocked for a device-to-device copy.

        A kill at any moment leaves the newest committed snapshot intact: the slot written is
        invalidated only once the previous snapshot is committed. With device staging that happens
        in the background commit, so `save` waits only for the previous commit's copy out of the
        device buffer, not for its checksum."""
        t0 = time.monotonic()
        self._wait_warm()
        cuda = next((t.device for t in tensors if t.is_cuda), None)
        device_staged = on_device and cuda is not None
        if device_staged:
            self._arena_free.wait()  # the commits before it (slot k's own among them) have finished
        else:
            self._wait_commit()
        k = self._choose()
        if not device_staged:
            self._wait_pin(k)
        held, self._held = self._held, 0.0
        waited = time.monotonic() - t0 + held
        specs, total = fmt.plan_stream(tensors)
        slot = self._slots[k]
        self._last = k
        pin = cuda is not None
        if not slot.ready(total, pin) and slot.would_cut(total):  # the state changed size: slot k's older
            # snapshot goes now, not at the commit (a slot mapped for this size already needs no look at its files)
            if device_staged:
                self._wait_commit()  # as the commit would: after the newest one has landed
                self._wait_pin(k)
            self._invalidate(k)
        view = slot.buffer(total, pin=pin)
        if not device_staged:
            self._invalidate(k)
        with self.replicator.paused() if self.replicator is not None else contextlib.nullcontext():
            staged = stage(tensors, total, None if device_staged else view, specs)
        snap = Snapshot(step, k, view, specs, total, structure_meta, memo=slot.memo)
        staged_at = time.monotonic()
        device = staged if device_staged else None
        if device is not None:
            self._arena_free.clear()
        snap.ready = self._commit = self._exec.submit(self._commit_slot, snap, device, staged_at,
                                                      staged_at - t0 + held, waited)
        self.warm(total, cuda)  # the other slot, before the next snapshot needs it
        return snap, waited

    def hold_if_committing(self) -> bool:
        """Back-pressure: the next forward pass (of any module) waits until the newest snapshot is
        committed, if it is not yet; return whether a hold was placed. The engine calls it at the
        end of the step before each snapshot step (`tiers.MemoryTiers.at_step`), so the hold falls
        on the forward of the step that ends in the next snapshot, and only when the commit has
        spanned every step since its snapshot.

        Commits are asynchronous and each rank's finishes on its own time. A rank that has not
        committed s does not start step s+m (m = `memory_every`), so no rank can finish s+m (and
        invalidate the slot holding s-m for s+m's snapshot) before every rank holds s: two slots
        always leave a step every rank holds (issue 27). A kill at any moment rolls back at most
        m + c steps, c the steps a commit spans, capped at m - 1 by the hold: at most m + 1 with
        commits shorter than a step, 2m - 1 at worst, m at m = 1 (docs/checkpoint.md, "A common
        step after any kill"). A loop with no `nn.Module` forward is not held. The seconds held
        are counted in the next snapshot's `ckpt_mem` (`waited` and `seconds`): its true cost."""
        commit = self._commit
        if commit is None or commit.done():
            return False
        if self._gate is not None:
            self._gate.remove()

        def gate(_module: Any, _args: Any) -> None:
            handle.remove()
            if self._gate is handle:
                self._gate = None
            t0 = time.monotonic()
            wait_futures([commit])  # its error, if any, is the engine's to report (`wait`)
            self._held += time.monotonic() - t0

        handle = self._gate = torch.nn.modules.module.register_module_forward_pre_hook(gate)
        return True

    def _wait_pin(self, k: int) -> None:
        pin = self._pins.release(k)
        if pin is not None:
            try:
                pin.result()  # a disk write from this slot: it must finish reading first
            except Exception:  # noqa: BLE001 - reported by the engine's failed-save policy
                pass

    def warm(self, total: int, device: torch.device | None) -> None:
        """Map both slots for a `total`-byte stream, registered with CUDA for `device` (None: a
        CPU state), in the background: the first snapshot into a slot would otherwise block the
        loop for it (seconds for GBs: allocating and pinning). The next `save` waits for what is
        left of it. A slot holding a snapshot of another size (the state grew: an optimizer's state
        after its first step) is left whole: it may be the step a peer rolls back to (two slots
        always leave a step every rank holds); the save that reuses it maps it."""
        pin = device is not None
        if all(s.ready(total, pin) for s in self._slots):
            return

        def job() -> None:
            with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
                for slot in self._slots:
                    if not slot.ready(total, pin) and not slot.would_cut(total):
                        slot.buffer(total, pin=pin)

        self._warming = self._exec.submit(job)

    def _wait_warm(self) -> None:
        fut, self._warming = self._warming, None
        if fut is not None:
            try:
                fut.result()
            except Exception:
                log.debug("warming the memory-tier slots failed", exc_info=True)

    def pin(self, slot: int, fut: Future[Any]) -> None:
        """A disk write reads slot `slot` until `fut` is done: the snapshot after next waits for it."""
        self._pins.claim(slot, fut)

    def _choose(self) -> int:
        """The slot the next snapshot goes to (`slots.choose`: not the newest's, unless the
        replicator is sending the other one)."""
        last = self._target_last()
        rep = self.replicator
        if rep is None:
            return slots.choose(last, None)
        with rep.lock:
            return slots.choose(last, rep.reading)

    def _invalidate(self, k: int) -> None:
        """Remove slot `k`'s manifest, under the replicator's lock: a send starts only on a slot that
        still has its manifest, so none starts on `k` from now on; one that started on it meanwhile
        (rare: the sender moved onto it while a disk write held it) is stopped first."""
        rep = self.replicator
        while rep is not None:
            with rep.lock:
                if rep.reading != k:
                    self._slots[k].invalidate()
                    return
            rep.cancel()
            rep.wait_idle(1.0)
        self._slots[k].invalidate()

    def _target_last(self) -> int:
        """The slot written last (at start: the newest complete one's, `slots.last_written`)."""
        if self._last is None:
            newest = self.newest()
            self._last = slots.last_written(newest[1] if newest else None)
        return self._last

    def _commit_slot(self, snap: Snapshot, device: torch.Tensor | None, staged_at: float, blocked: float,
                     waited: float) -> None:
        slot = self._slots[snap.slot]
        if device is not None:  # device staging: the device-to-host copy, off the training loop's stream
            try:
                self._wait_pin(snap.slot)
                self._invalidate(snap.slot)  # the previous commit has finished: a complete snapshot stays
                with torch.cuda.device(device.device):
                    if self._stream is None:
                        self._stream = torch.cuda.Stream()
                    with torch.cuda.stream(self._stream):
                        snap.view.copy_(device, non_blocking=True)
                    self._stream.synchronize()
            finally:
                self._arena_free.set()
        crc = checksum_of(fmt.byte_view(snap.view), self._crc_pool) if snap.total else checksum(b"")
        meta_crc = checksum(snap.meta)
        memdir.write_private(slot.path / fmt.META, snap.meta)
        files = {
            fmt.META: fmt.FileEntry(len(snap.meta), meta_crc),
            DATA: fmt.FileEntry(snap.total, crc, (0, snap.total)),
        }
        manifest = fmt.Manifest(
            "plain", snap.step, files, created=time.time(), world_size=_world_size(), run_id=self.run_id,
            stream_bytes=snap.total, tensors=tuple(snap.specs), checksum=CHECKSUM,
        )
        tmp = slot.path / f".{fmt.MANIFEST}.tmp"
        fmt.write_manifest(tmp, manifest, durable=False)
        os.chmod(tmp, 0o600)
        os.rename(tmp, slot.path / fmt.MANIFEST)  # the commit point
        if self.replicator is not None:
            self.replicator.offer(snap.step, snap.slot)
        self.events.emit("ckpt_mem", step=snap.step, seconds=round(blocked, 6), waited=round(waited, 6),
                         commit=round(time.monotonic() - staged_at, 6), bytes=snap.total)

    def _wait_commit(self) -> None:
        fut, self._commit = self._commit, None
        if fut is not None:
            fut.result()

    def wait(self) -> None:
        """Block until the snapshot in flight is committed (raises its error if it failed) and the
        slots are mapped."""
        self._wait_commit()
        self._wait_warm()

    # --- loading -------------------------------------------------------------------------------

    def steps(self, world_size: int) -> dict[int, int]:
        """{step: slot} of the complete-looking slots (manifest intact, same world size and run,
        data file of the right size); the data is verified only by `verify`."""
        found: dict[int, int] = {}
        for k, slot in enumerate(self._slots):
            m = slot.manifest()
            if m is None or m.kind != "plain" or m.step is None or m.world_size != world_size:
                continue
            if self.run_id and m.run_id and m.run_id != self.run_id:
                continue
            try:
                if (slot.path / DATA).stat().st_size != m.stream_bytes:
                    continue
            except OSError:
                continue
            found[m.step] = k
        return found

    def newest(self) -> tuple[int, int] | None:
        """(step, slot) of the newest complete-looking slot, whatever its world size."""
        best: tuple[int, int] | None = None
        for k, slot in enumerate(self._slots):
            m = slot.manifest()
            if m is not None and m.step is not None and (best is None or m.step > best[0]):
                best = (m.step, k)
        return best

    def verify(self, step: int, slot: int, state: Mapping[str, Any]) -> Verified:
        """Every check of a disk load, on slot `slot` holding `step`; the state does not change.
        Raises `format.CorruptCheckpoint` (damaged) or `CheckpointMismatch` (another state's)."""
        path = self._slots[slot].path
        manifest = fmt.read_manifest(path / fmt.MANIFEST)
        if manifest.step != step or manifest.kind != "plain" or fmt.data_file_names(manifest.files) != [DATA]:
            raise fmt.CorruptCheckpoint(f"memory slot {path}: not a step {step} snapshot")
        if manifest.checksum != CHECKSUM:
            raise fmt.CorruptCheckpoint(f"memory slot {path}: {manifest.checksum} checksums, this process verifies {CHECKSUM}")
        reader.check_sizes(path, manifest)
        meta_bytes = (path / fmt.META).read_bytes()
        if checksum(meta_bytes) != manifest.files[fmt.META].crc32:
            raise fmt.CorruptCheckpoint(f"memory slot {path}: {fmt.META} checksum mismatch")
        meta = reader.decode_meta(meta_bytes, manifest)
        current, _ = st.snapshot_entries(state)
        problems = reader.fit_problems(meta["entries"], manifest.tensors, current)
        if problems:
            raise CheckpointMismatch(f"memory snapshot step {step} does not fit the state: " + "; ".join(problems[:5]))
        sharded = _sharded_targets(meta, manifest.tensors, state)
        data = map_snapshot(path / DATA, manifest.stream_bytes)
        devices = _upload_devices(meta["entries"], manifest.tensors, current, sharded)
        staged: list[torch.Tensor] | None = None
        if data is None:
            got = checksum(b"")
        elif devices is not None:
            got, staged = upload.upload(bytes_of(data), manifest.tensors, devices, pool=self._crc_pool, threads=THREADS)
        else:
            got = checksum_of(memoryview(data), self._crc_pool)
        if got != manifest.files[DATA].crc32:
            if data is not None:
                data.close()
            raise fmt.CorruptCheckpoint(f"memory slot {path}: {DATA} checksum mismatch")
        return Verified(step, slot, manifest, meta, data, staged, sharded)

    def restore(self, v: Verified, state: MutableMapping[str, Any]) -> None:
        """Put a verified snapshot into `state`, then `load_state_dict` as a disk load does.

        A tensor the state already has (same shape and dtype: a module's parameters) is copied
        into in place. One it lacks (an optimizer's state after a restart) would need new memory,
        and faulting in fresh pages costs more than the copy; on the CPU it becomes a view of the
        snapshot's own shared pages instead (zero copy), and the slot is *detached*: its files are
        removed so no later snapshot writes into the live state, and a replacement is allocated in
        the background. On CUDA such tensors are allocated on the state's device and copied.

        A snapshot `verify` already uploaded (`Verified.staged`) is handed over as it is: the slot
        stays intact for a later restart."""
        self._wait_warm()  # a slot may be being mapped in the background
        if v.staged is not None:
            staged = v.staged if v.targets is None else [_into(v.targets.get(i), t) for i, t in enumerate(v.staged)]
            st.restore(state, st.unflatten(v.meta["entries"], staged), list(v.meta["stateful"]))
            self._last = v.slot
            if v.data is not None:
                self._exec.submit(unmap, v.data)  # unmapping GBs of populated pages takes a while
            self.warm(v.manifest.stream_bytes, next((t.device for t in v.staged if t.is_cuda), None))
            return
        current, _ = st.snapshot_entries(state)
        targets: dict[int, torch.Tensor] = {}
        if v.targets is not None:
            targets = v.targets
        else:
            _pair(v.meta["entries"], current, targets)
        home = _home_device(current)
        src = bytes_of(v.data)
        tensors: list[torch.Tensor] = []
        copied: list[fmt.TensorSpec] = []
        for i, spec in enumerate(v.manifest.tensors):
            dtype = fmt.dtype_from_name(spec.dtype)
            part = src.narrow(0, spec.offset, spec.nbytes).view(dtype).view(spec.shape)
            dst = targets.get(i)
            if dst is not None and dst.dtype == dtype and tuple(st.local_part(dst).shape) == spec.shape:
                st.local_part(dst).copy_(part)  # a DTensor: this rank's part, in place
                copied.append(spec)
            elif home.type == "cpu" or len(spec.shape) == 0:
                dst = part  # zero copy: the snapshot's pages become the state's
            else:
                dst = torch.empty(spec.shape, dtype=dtype, device=home)
                dst.copy_(part)
                copied.append(spec)
            tensors.append(dst)
        if home.type == "cuda":
            torch.cuda.synchronize(home)
        detach = len(copied) < len(v.manifest.tensors)
        if detach:
            self._slots[v.slot].detach()
        st.restore(state, st.unflatten(v.meta["entries"], tensors), list(v.meta["stateful"]))
        self._last = v.slot
        if detach:
            # In the background: give back the pages of what was copied out, and allocate the
            # slot's replacement (the snapshot after next waits for it).
            self._pins.claim(v.slot, self._exec.submit(self._refill, v.slot, v.data, copied, v.manifest.stream_bytes))

    def _refill(self, slot: int, data: mmap.mmap | None, copied: list[fmt.TensorSpec], total: int) -> None:
        release_pages(data, copied)
        self._slots[slot].buffer(total)

    def forget_newer(self, step: int) -> None:
        """Invalidate snapshots newer than `step` (the job resumed from `step`: they belong to the
        timeline that was abandoned and must never be restored later)."""
        for slot in self._slots:
            m = slot.manifest()
            if m is not None and m.step is not None and m.step > step:
                slot.invalidate()
        newest = self.newest()
        self._last = newest[1] if newest else None
        if self.replicator is not None:
            try:
                replica.forget(self.replicator.addr, self.key, self.rank, step)
            except (WireError, OSError) as err:
                log.warning("could not drop the buddy's memory snapshots newer than step %d: %s", step, err)

    # --- the buddy node's copies (resctl.checkpoint.replica) ------------------------------------

    def replicate_to(self, addr: str | None) -> None:
        """From now on send each committed snapshot to the replica server at `addr` (None: stop)."""
        if self.replicator is not None and self.replicator.addr == addr:
            return
        if self.replicator is not None:
            self.replicator.close()
            self.replicator = None
        if addr:
            self.replicator = Replicator(addr, self.key, self.rank, [s.path for s in self._slots], self.events.emit)

    def buddy_steps(self, world_size: int) -> set[int]:
        """The steps of this rank's snapshots the buddy holds (same world size and run); empty if
        there is no buddy or it cannot be reached."""
        if self.replicator is None:
            return set()
        try:
            held = replica.listing(self.replicator.addr, self.key, self.rank)
        except (WireError, OSError) as err:
            log.warning("the buddy node's memory snapshots are out of reach (%s): %s", replica.shown(self.replicator.addr),
                        err)
            return set()
        found = set()
        for p in held:
            try:
                body = json.loads(p.manifest)["body"]
            except (ValueError, KeyError, TypeError):
                continue
            if body.get("world_size") == world_size and (not self.run_id or body.get("run_id") in ("", None, self.run_id)):
                found.add(p.step)
        return found

    def fetch(self, step: int) -> int:
        """Copy this rank's snapshot of `step` back from the buddy into a local slot (the one not
        holding the newest local snapshot); return the slot, to `verify` and `restore` as usual."""
        assert self.replicator is not None
        self._wait_warm()  # a background mapping of the slot must not outlive the files it maps
        newest = self.newest()
        k = slots.fetch_slot(newest[1] if newest else None)
        self._wait_pin(k)
        slot = self._slots[k]
        with self.replicator.lock:
            slot.detach()  # new files: no mapping of this process sees the bytes change
        replica.fetch(self.replicator.addr, self.key, self.rank, step, slot.path)
        return k

    # --- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Finish the commit in flight and unmap (the files stay for a restarted worker)."""
        if self._gate is not None:
            self._gate.remove()
            self._gate = None
        try:
            self._wait_commit()
        except Exception:
            log.warning("memory snapshot commit failed", exc_info=True)
        self._wait_warm()
        if self.replicator is not None:
            self.replicator.close()
            self.replicator = None
        self._exec.shutdown(wait=True)
        self._crc_pool.shutdown(wait=True)
        for slot in self._slots:
            slot.close()

    def release(self) -> None:
        """Close and remove this rank's snapshots (a clean end of the script)."""
        self.close()
        memdir.release_rank(self.key, self.rank, self.root)


def _pair(saved: Any, current: Any, out: dict[int, torch.Tensor]) -> None:
    """Map each tensor placeholder of a saved structure to the state's tensor at the same place."""
    if st.is_placeholder(saved):
        if isinstance(current, torch.Tensor) and current.is_contiguous() and not st.is_sharded(current):
            out.setdefault(saved[1], current)
        return
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        for key in saved.keys() & current.keys():
            _pair(saved[key], current[key], out)
    elif isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)):
        for a, b in zip(saved, current):
            _pair(a, b, out)


def _sharded_targets(meta: Mapping[str, Any], specs: tuple[fmt.TensorSpec, ...],
                     state: Mapping[str, Any]) -> dict[int, torch.Tensor] | None:
    """A sharded snapshot's targets (None for a plain one): each saved tensor's, by path, as a sharded disk
    load chooses them (`shardtargets.choose`: a fresh optimizer's state made like its parameter, same
    placement); raises when a local part has no DTensor to go into (it needs the state's mesh and placements)."""
    local = list(meta.get("local", ()))
    if not local:
        return None

    def fits(i: int, t: torch.Tensor) -> bool:
        spec = specs[i]
        part = st.local_part(t)
        return fmt.dtype_name(t.dtype) == spec.dtype and tuple(part.shape) == spec.shape and part.is_contiguous()

    targets = shardtargets.choose(meta["entries"], state, fits, lambda i: fmt.dtype_from_name(specs[i].dtype), None)
    missing = [i for i in local if i not in targets or not st.is_sharded(targets[i])]
    if missing:
        raise CheckpointMismatch(f"{len(missing)} sharded tensors of the snapshot have no DTensor in the state to "
                                 "restore into (another world size, or another model)")
    return targets


def _home_device(entries: Mapping[str, Any]) -> torch.device:
    """Where new tensors go: the device of the state's first tensor (an optimizer's state follows
    its parameters), else the CPU."""
    for t in st.find_tensors(entries):
        return t.device
    return torch.device("cpu")


def _world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


#: Device memory left free after an upload-verify (allocator slack, the step's activations).
UPLOAD_HEADROOM = 512 << 20


def _into(target: torch.Tensor | None, staged: torch.Tensor) -> torch.Tensor:
    """An uploaded tensor of a sharded snapshot: copied into its DTensor's local part (on the device), else as is."""
    if target is None or not st.is_sharded(target):
        return staged
    st.local_part(target).copy_(staged)
    return target


def _upload_devices(saved: Any, specs: tuple[fmt.TensorSpec, ...], current: Mapping[str, Any],
                    targets: dict[int, torch.Tensor] | None = None) -> list[torch.device] | None:
    """Where each snapshot tensor goes when `verify` uploads while it checksums: the device of the
    state's tensor at the same place, else the state's device (scalars, e.g. an optimizer's step
    count, stay on the CPU); None when the state is not on CUDA or its device lacks the room."""
    home = _home_device(current)
    if home.type != "cuda":
        return None
    if targets is None:  # a sharded snapshot's are chosen by path (`_sharded_targets`)
        targets = {}
        _pair(saved, current, targets)
    devices = []
    for i, spec in enumerate(specs):
        t = targets.get(i)
        device = st.local_part(t).device if t is not None else None
        devices.append(device or (torch.device("cpu") if len(spec.shape) == 0 else home))
    need: dict[torch.device, int] = {}
    for d, spec in zip(devices, specs):
        if d.type == "cuda":
            need[d] = need.get(d, 0) + spec.nbytes
    for d, nbytes in need.items():
        free, _ = torch.cuda.mem_get_info(d)
        if free < nbytes + UPLOAD_HEADROOM:
            log.info("memory-tier restore: %.2f GB free on %s, %.2f GB needed to upload while verifying; "
                     "verifying first, then copying", free / 1e9, d, nbytes / 1e9)
            return None
    return devices
