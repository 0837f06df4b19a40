"""The checkpoint engine: staging, parallel verified writes, atomic publish, pruning, loading.

One `Checkpointer` per process. A save runs in three phases:

1. **stage** (in the caller's thread): every tensor of the state is copied into one reusable
   byte *arena* (pinned host memory when any tensor is on CUDA) at the offsets of the stream
   (see `resctl.checkpoint.format`). After this the training loop may change its tensors.
2. **write** (background, when async): the arena is cut into `writers` equal byte ranges; a pool
   of threads writes one file each with os.write, computing CRC32 as it goes, and fsyncs it.
   Threads, not a process: os.write and zlib.crc32 release the GIL, so N threads keep N writes in
   flight, and nothing re-imports the user's `__main__` (NVRx's spawned writer would).
3. **publish**: meta.pt and manifest.json are written and fsynced, the temp directory is renamed
   to `step-<N>` and the parent directory fsynced; only then are older checkpoints pruned.

Why not NVRx's `TorchAsyncCheckpoint`: it fails on CPU-only torch (torch.cuda.synchronize), it
writes with a single `torch.save` (~30 % of a disk's multi-writer bandwidth on the H200), and
its spawned persistent process re-imports `__main__` and keeps staging memory alive. Our arena
plus thread pool keeps the same contract (stage, return, write in the background) on CPU and GPU.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, MutableMapping

import torch

from resctl.checkpoint import format as fmt
from resctl.checkpoint import agree, memdir, reader, replica, sharded
from resctl.checkpoint import state as st
from resctl.checkpoint.errors import CheckpointError, CheckpointMismatch, SaveFailuresExceeded
from resctl.checkpoint.owner import Ownership
from resctl.telemetry.events import NULL_LOG, EventLog

if TYPE_CHECKING:
    from resctl.checkpoint.memory import MemoryTier, Snapshot
    from resctl.profile.schema import Checkpoint as CheckpointSection

log = logging.getLogger("resctl.checkpoint")

HEARTBEAT_EVERY = 1.0  # seconds between heartbeats sent from writer threads
QUARANTINE = ".quarantine"
_QUARANTINED = re.compile(r"^step-\d+-\d{8}T\d{6}-[0-9a-f]{6}$")  # the names `quarantine` gives
LEFTOVERS = (".tmp-step-", ".trash-", ".recycle-")
# A candidate's verdict on one rank; the ranks agree on the MIN.
_MISMATCH, _SKIP, _OK = 0, 1, 2

__all__ = ["CheckpointError", "CheckpointMismatch", "Checkpointer", "SaveFailuresExceeded"]


def current_run_id() -> str:
    """The job's run id (the launcher's rendezvous id: the same in every worker and restart), or ""."""
    return os.environ.get("TORCHELASTIC_RUN_ID", "")


def _dist_ready() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class Checkpointer:
    """Async, atomic, verified checkpoints of a `state` dict into `dir`.

    Args:
        dir: checkpoint directory (shared storage when several nodes load from it).
        interval_steps: `maybe_save` saves when `step % interval_steps == 0`.
        async_: return from `save` once the state is staged and write in the background.
        keep_last: complete checkpoints to keep; older ones are pruned after a newer one lands.
        writers: parallel writer threads (one data file each).
        stage: where `save` snapshots CUDA tensors before it returns. "host" (default): straight
            into a pinned host arena (blocks for the device-to-host copy, ~55 GB/s on an H200).
            "device": into a spare device arena (a device-to-device copy, ~100x faster), then the
            background writer copies it to pinned host memory; costs GPU memory equal to the
            state, and falls back to "host" with a warning when that allocation fails.
        recycle: reuse the files of a pruned checkpoint for the next write (overwritten in place
            inside a hidden temp directory) instead of deleting them and allocating new ones. On
            local disks mounted with `discard` a deletion makes the next write's fsync wait for the
            TRIM of the freed blocks (measured on the H200 machine's ext4: 74 -> 93 ms for 101 MB
            back to back); recycling also skips the block allocation. Off: delete, as before.
        rank, world_size: default to torch.distributed when initialised, else env RANK /
            WORLD_SIZE, else 0 / 1 (looked up at every call: in-process restarts may renumber).
        events: an `EventLog` for `ckpt_stall`, `ckpt_persist`, `ckpt_prune` and `ckpt_skip`.
        heartbeat: a zero-argument callable called before and after each save and, at most once
            a second, from the writer threads while a write runs (it must be thread-safe).
        max_failed_saves: a failed write (full disk, I/O error, permissions) is reported (log
            error, `ckpt_fail` event) and the next interval tries again; this many failures in a
            row raise `SaveFailuresExceeded` from `save`/`wait` (1: the first failure raises).
        run_id: written into every manifest, so a resume from another run's checkpoint is
            reported (`ckpt_other_run`); default: env TORCHELASTIC_RUN_ID.
        exclusive: rank 0 holds an flock on `<dir>/.resctl-owner` from its first load or save, and
            another live process owning the directory raises `CheckpointDirInUse`.
        keep_quarantined: damaged checkpoints kept in `<dir>/.quarantine/` (the newest by the time
            they were moved there); older ones are deleted when another is moved in (0: at once).
        memory_every: also snapshot the state every this many steps into host shared memory that
            outlives the process (`resctl.checkpoint.memory`; 0: off). `load` then restores the
            newest snapshot every rank holds when it is at least as new as the newest disk
            checkpoint, and a disk save of the same step is written from the snapshot.
        memory_replicate: also copy each snapshot to the buddy node's replica server (the one
            `resctl run` starts; `resctl.checkpoint.replica`) and, when this node's memory has no
            usable snapshot, restore from the buddy's copy before falling back to disk.
    """

    def __init__(
        self,
        *,
        dir: str | os.PathLike[str] = "checkpoints",
        interval_steps: int = 100,
        async_: bool = True,
        keep_last: int = 2,
        writers: int = 4,
        stage: str = "host",
        recycle: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        events: EventLog | None = None,
        heartbeat: Callable[[], None] | None = None,
        max_failed_saves: int = 3,
        run_id: str | None = None,
        exclusive: bool = True,
        memory_every: int = 0,
        memory_replicate: bool = False,
        keep_quarantined: int = 3,
    ) -> None:
        if interval_steps < 1 or keep_last < 1 or writers < 1 or max_failed_saves < 1:
            raise ValueError("interval_steps, keep_last, writers and max_failed_saves must be >= 1")
        if keep_quarantined < 0:
            raise ValueError("keep_quarantined must be >= 0")
        self.keep_quarantined = keep_quarantined
        if memory_every < 0:
            raise ValueError("memory_every must be >= 0 (0: no memory tier)")
        self.memory_every = memory_every
        self.memory_replicate = memory_replicate
        if memory_every:
            import resctl.checkpoint.memory  # noqa: F401 - imported now, not inside a restart's load
        self._memory: MemoryTier | None = None
        #: Why this process stopped taking memory snapshots (a failed one), or None.
        self.memory_off: str | None = None
        if stage not in ("host", "device"):
            raise ValueError(f"stage must be 'host' or 'device', not {stage!r}")
        self.stage = stage
        self.dir = Path(dir)
        self.interval_steps = interval_steps
        self.async_ = async_
        self.keep_last = keep_last
        self.writers = writers
        self._rank = rank
        self._world_size = world_size
        self.events = events if events is not None else NULL_LOG
        self.heartbeat = heartbeat
        self._bg = ThreadPoolExecutor(1, thread_name_prefix="resctl-ckpt")
        self._pool = ThreadPoolExecutor(writers, thread_name_prefix="resctl-ckpt-writer")
        self._inflight: Future[None] | None = None
        self._inflight_step: int | None = None
        self._inflight_path: Path | None = None
        self._arena: torch.Tensor | None = None
        self._dev_arena: torch.Tensor | None = None
        self._views: tuple[Any, list[torch.Tensor]] | None = None  # (arena and layout, its tensor views)
        self._meta_checked: tuple[Any, list[str]] | None = None  # the last structure that passed weights_only
        self._d2h_stream: Any = None
        # Pruning runs on its own thread after a checkpoint is durable, so the next save waits for
        # durability only, not for deleting old checkpoints (slow on filesystems mounted with
        # `discard`: ~2.6 s for 6.4 GB on the H200 machine's ext4).
        self._prune_exec = ThreadPoolExecutor(1, thread_name_prefix="resctl-ckpt-prune")
        self._prune_fut: Future[None] | None = None
        #: Seconds the last prune took (diagnostics; None before the first one).
        self.last_prune_s: float | None = None
        self._cleaned = False
        self.recycle = recycle
        # The pruned checkpoint directory waiting to be overwritten by the next write (at most one).
        self._recycled: Path | None = None
        self._recycle_lock = threading.Lock()
        self._beat_lock = threading.Lock()
        self._last_beat = 0.0
        self._latest: tuple[MutableMapping[str, Any], int] | None = None
        self.last_saved_step: int | None = None
        self._fail_next: str | None = None
        self._final_deadline: float | None = None
        self._final_requested = False
        #: Set once a final save requested by `request_final_save` is durable (or was skipped).
        self.final_done = threading.Event()
        #: After `request_final_save`, asked at each step boundary whether the final save is due at
        #: `step` (True) or at a later boundary (False: the boundary saves as usual and training goes
        #: on). None: at the first boundary. The shim's stop step (resctl/shim/stopstep.py) sets it.
        self.final_gate: Callable[[int], bool] | None = None
        #: Called at the boundary of the final save once it is over (on the training thread).
        self.after_final: Callable[[], None] | None = None
        self.max_failed_saves = max_failed_saves
        #: Writes that failed since the last one that landed.
        self.failed_in_a_row = 0
        self.run_id = current_run_id() if run_id is None else run_id
        self.exclusive = exclusive
        self._owner = Ownership(self.dir, self.run_id)
        # Steps known good: published durably by this process, or verified by its load. Pruning
        # counts only these, so damaged or unknown directories never push a good one out.
        self._verified: set[int] = set()

    @classmethod
    def from_section(cls, section: "CheckpointSection", **kw: Any) -> "Checkpointer":
        """A Checkpointer from a profile's `[checkpoint]` section; `kw` adds rank, events, heartbeat."""
        args: dict[str, Any] = dict(
            dir=section.dir,
            interval_steps=section.interval_steps,
            async_=section.async_,
            keep_last=section.keep_last,
            writers=section.writers,
            stage=section.stage,
            recycle=section.recycle,
            max_failed_saves=section.max_failed_saves,
            memory_every=section.memory_every,
            memory_replicate=section.memory_replicate,
            keep_quarantined=section.keep_quarantined,
        )
        args.update(kw)
        return cls(**args)

    # --- identity ------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        if self._rank is not None:
            return self._rank
        if _dist_ready():
            return torch.distributed.get_rank()
        return int(os.environ.get("RANK", "0"))

    @property
    def world_size(self) -> int:
        if self._world_size is not None:
            return self._world_size
        if _dist_ready():
            return torch.distributed.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    # --- heartbeats ----------------------------------------------------------------------------

    def beat(self, force: bool = False) -> None:
        """Call the heartbeat (at most once a second unless `force`); never raises."""
        if self.heartbeat is None:
            return
        now = time.monotonic()
        with self._beat_lock:
            if not force and now - self._last_beat < HEARTBEAT_EVERY:
                return
            self._last_beat = now
            try:
                self.heartbeat()
            except Exception:  # noqa: BLE001 - a failing heartbeat must not fail the checkpoint
                log.debug("checkpoint heartbeat failed", exc_info=True)

    # --- saving --------------------------------------------------------------------------------

    def save(self, state: MutableMapping[str, Any], step: int, snapshot: "Snapshot | None" = None) -> None:
        """Save `state` as checkpoint `step`.

        Waits for the previous save first (the wait is reported as `waited` in `ckpt_stall`),
        and reports it if that save failed (`record_failure`: raises `SaveFailuresExceeded` only at
        `max_failed_saves` failures in a row). With async on, returns once the state is staged;
        otherwise once it is durable (or failed). `snapshot`: a memory snapshot of this state at
        this step, written to disk as it is (no second copy out of the state).
        """
        t0 = time.monotonic()
        self.beat(force=True)
        waited = self.wait_previous()
        entries, stateful = st.snapshot_entries(state)
        self.start()
        self.last_saved_step = step  # undone by record_failure if the write fails
        if any(st.is_sharded(t) for t in st.find_tensors(entries)):
            self._save_sharded(entries, stateful, step)
        elif self.rank == 0:
            self._save_plain(entries, stateful, step, snapshot if snapshot is not None and snapshot.step == step else None)
        # Other ranks of replicated state write nothing: rank 0's copy is everyone's.
        blocked = time.monotonic() - t0
        self.events.emit("ckpt_stall", step=step, seconds=round(blocked, 6), waited=round(waited, 6))
        self.beat(force=True)

    def _save_sharded(self, entries: dict[str, Any], stateful: list[str], step: int) -> None:
        """Collective and synchronous (see `sharded`); a failure goes through `record_failure` on every rank."""
        t0 = time.monotonic()
        try:
            total = sharded.save(self.dir, entries, stateful, step, writers=self.writers, beat=self.beat,
                                 publish=self.publish, run_id=self.run_id)
        except Exception as err:  # noqa: BLE001
            self.record_failure(step, err)
            return
        self.failed_in_a_row = 0
        if total is not None:
            self.events.emit("ckpt_persist", step=step, seconds=round(time.monotonic() - t0, 6), bytes=total)
            self.prune(recycle=False)  # only the plain writer overwrites recycled files

    def maybe_save(self, state: MutableMapping[str, Any], step: int) -> bool:
        """Save when `step % interval_steps == 0`; always remember (state, step) for `save_final`.

        After `request_final_save()`, the next call (a step boundary) that `final_gate` allows (all,
        without a gate) runs `save_final()` instead, whatever the interval, sets `final_done` and
        calls `after_final`.
        """
        self._latest = (state, step)
        if self._final_requested and (self.final_gate is None or self.final_gate(step)):
            return self._final_boundary()
        snap = None
        if self.memory_every and step % self.memory_every == 0:
            snap = self.save_memory(state, step)
        if step % self.interval_steps == 0:
            self.save(state, step, snapshot=snap)
            return True
        return False

    def _final_boundary(self) -> bool:
        self._final_requested = False
        try:
            deadline = self._final_deadline
            if deadline is None or time.monotonic() < deadline:
                self.save_final()
            else:
                log.warning("final checkpoint skipped: the SIGTERM grace period is over")
                self.wait()
        finally:
            self.final_done.set()
            if self.after_final is not None:
                self.after_final()
        return True

    @property
    def latest_step(self) -> int | None:
        """The step last given to `maybe_save` (None before the first call)."""
        latest = self._latest
        return None if latest is None else latest[1]

    # --- the memory tier -----------------------------------------------------------------------

    def memory_tier(self) -> "MemoryTier | None":
        """This rank's memory tier (created on first use), or None when off or turned off."""
        if not self.memory_every or self.memory_off is not None:
            return None
        tier = self._memory
        if tier is not None and tier.rank != self.rank:  # an in-process restart renumbered the ranks
            tier.close()
            tier = self._memory = None
        if tier is None:
            from resctl.checkpoint.memory import MemoryTier

            tier = self._memory = MemoryTier(memdir.job_key(self.run_id, self.dir), self.rank, run_id=self.run_id,
                                             events=self.events)
        return tier

    def save_memory(self, state: MutableMapping[str, Any], step: int) -> "Snapshot | None":
        """Snapshot `state` into the memory tier (blocks for the copy only); None if it could not."""
        tier = self.memory_tier()
        if tier is None:
            return None
        entries, stateful = st.snapshot_entries(state)
        tensors: list[torch.Tensor] = []
        try:
            structure = st.flatten(entries, tensors, {})  # a sharded state raises: not supported here
            meta = self._encode_meta(step, structure, stateful)
            snap, _ = tier.save(tensors, meta, step, self._stage, on_device=self.stage == "device")
        except Exception as err:  # noqa: BLE001 - the disk tier goes on; the memory tier stops
            self._memory_off(err)
            return None
        return snap

    def _encode_meta(self, step: int, structure: Any, stateful: list[str]) -> bytes:
        """The snapshot's meta.pt; the weights_only check is skipped for a structure equal to one
        that passed it (a snapshot every step would otherwise pay a decode each time)."""
        meta = {"step": step, "entries": structure, "stateful": stateful}
        seen = (structure, stateful)
        if self._meta_checked is not None and self._meta_checked == seen:
            return st.encode_meta(meta, check=False)
        data = st.encode_meta(meta)
        self._meta_checked = seen
        return data

    def _memory_off(self, err: BaseException) -> None:
        log.warning("memory-tier snapshots turned off in this process (%s: %s); disk checkpoints go on",
                    type(err).__name__, err)
        self.events.emit("ckpt_mem_off", error=f"{type(err).__name__}: {err}")
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        self.memory_off = f"{type(err).__name__}: {err}"

    def release_memory(self) -> None:
        """Remove this rank's memory snapshots (the script finished cleanly: nothing will restore them)."""
        if self._memory is not None:
            self._memory.release()
            self._memory = None
        elif self.memory_every:
            memdir.release_rank(memdir.job_key(self.run_id, self.dir), self.rank)

    def save_final(self) -> int | None:
        """Finish the in-flight write, then save the state last given to `maybe_save` synchronously
        unless its step is already saved; return the step now durable (None if nothing known).

        Call it at a step boundary (e.g. the shim's SIGTERM handler sets a flag and the step loop
        calls this), not from a signal handler that may have interrupted optimizer.step().
        """
        try:
            self.wait()
        except CheckpointError as err:
            log.warning("%s", err)
        if self._latest is None:
            return self.last_saved_step
        state, step = self._latest
        if step != self.last_saved_step:
            saved_async, self.async_ = self.async_, False
            try:
                self.save(state, step)
            finally:
                self.async_ = saved_async
        return step

    @property
    def tracks_state(self) -> bool:
        """Whether the script has called `maybe_save` (so a final save at a step boundary can come)."""
        return self._latest is not None

    def request_final_save(self, deadline: float | None = None) -> None:
        """Ask for a final synchronous save at the next `maybe_save` (safe from a signal handler:
        it only sets flags). `deadline` is a `time.monotonic()` value after which the final save
        is skipped; `final_done` is set when it is over either way."""
        self._final_deadline = deadline
        self._final_requested = True

    def fail_next_write(self, message: str) -> None:
        """Fault drill: make the next background write fail part-way (data written, no manifest)
        with `message`; the failure surfaces on the following save()/wait() like a real one."""
        self._fail_next = message

    def take_injected_failure(self) -> str | None:
        """The pending fault-drill message, cleared (taken when a save is staged)."""
        message, self._fail_next = self._fail_next, None
        return message

    def wait(self) -> None:
        """Block until the in-flight write is durable and old checkpoints are pruned; raise
        `CheckpointError` if the write failed."""
        try:
            self.wait_previous()
        finally:
            self._wait_prune()
            self._wait_memory()

    def _wait_memory(self) -> None:
        if self._memory is not None:
            try:
                self._memory.wait()
            except Exception as err:  # noqa: BLE001 - an uncommitted snapshot is never offered
                self._memory_off(err)

    def _wait_prune(self) -> None:
        fut, self._prune_fut = self._prune_fut, None
        if fut is not None:
            try:
                fut.result()
            except Exception:  # noqa: BLE001 - a failed prune leaves extra checkpoints, no harm
                log.warning("pruning old checkpoints in %s failed", self.dir, exc_info=True)

    def _prune_after_durable(self) -> None:
        """Prune now when saving synchronously; else on the prune thread (one at a time, in order)."""
        if not self.async_:
            self._timed_prune()
            return
        self._prune_fut = self._prune_exec.submit(self._timed_prune)

    def _timed_prune(self) -> None:
        t0 = time.monotonic()
        removed = self.prune()
        self.last_prune_s = time.monotonic() - t0
        if removed:
            self.events.emit("ckpt_prune", removed=removed, seconds=round(self.last_prune_s, 6))

    def pending_path(self) -> Path | None:
        """The final path of the write in flight, if any (used by the torch.load interceptor)."""
        fut = self._inflight
        return self._inflight_path if fut is not None and not fut.done() else None

    def close(self) -> None:
        """Finish writes and stop the threads."""
        try:
            self.wait()
        finally:
            self._bg.shutdown(wait=True)
            self._pool.shutdown(wait=True)
            self._prune_exec.shutdown(wait=True)
            with self._recycle_lock:
                waiting, self._recycled = self._recycled, None
            if waiting is not None:  # nobody will overwrite it now: give the space back
                shutil.rmtree(waiting, ignore_errors=True)
            if self._memory is not None:
                self._memory.close()
            self._owner.release()

    def wait_previous(self) -> float:
        """Wait for the write in flight; return the seconds waited. A failed write is reported
        (`record_failure`), and raises only when it makes `max_failed_saves` in a row."""
        fut, step = self._inflight, self._inflight_step
        if fut is None:
            return 0.0
        t0 = time.monotonic()
        try:
            fut.result()
        except Exception as err:  # noqa: BLE001 - every write failure goes through the policy
            self.record_failure(step, err)
        else:
            self.failed_in_a_row = 0
        finally:
            self._inflight = None
            self._inflight_step = None
            self._inflight_path = None
        return time.monotonic() - t0

    def submit(self, job: Callable[[], None], step: int | None, path: Path | None) -> None:
        """Run `job` (a write) in the background when async, else now; a failure goes through
        `record_failure` (now when sync, at the next save()/wait() when async)."""
        if self.async_:
            self._inflight = self._bg.submit(job)
            self._inflight_step, self._inflight_path = step, path
            return
        try:
            job()
        except Exception as err:  # noqa: BLE001
            self.record_failure(step, err)
        else:
            self.failed_in_a_row = 0

    def record_failure(self, step: int | None, err: BaseException) -> None:
        """A write failed (it was never made visible): report it loudly and let the next interval
        retry; raise `SaveFailuresExceeded` when it is the `max_failed_saves`-th in a row."""
        self.failed_in_a_row += 1
        if step is not None and self.last_saved_step == step:
            self.last_saved_step = None  # not saved: a final save may try this step again
        cause = f"{type(err).__name__}: {err}"
        self.events.emit("ckpt_fail", step=step, error=cause, consecutive=self.failed_in_a_row,
                         limit=self.max_failed_saves)
        where = f"the newest complete checkpoint in {self.dir} is still the one that loads"
        if self.failed_in_a_row >= self.max_failed_saves:
            raise SaveFailuresExceeded(
                f"checkpoint step {step} failed while writing ({cause}), {self.failed_in_a_row} failed writes in a row "
                f"(checkpoint.max_failed_saves = {self.max_failed_saves}). Nothing partial was made visible; {where}. "
                "Free space or fix permissions of the checkpoint dir, then restart the job."
            ) from err
        log.error("checkpoint step %s failed while writing (%s); not made visible, %s; the next save tries "
                  "again (%d of %d failures in a row allowed)", step, cause, where, self.failed_in_a_row,
                  self.max_failed_saves - 1)

    def start(self) -> None:
        """Once, before the first load or save: on rank 0 take the directory's ownership lock and
        remove what killed writers left (temp, trash and recycle directories; no writer of this
        job is active yet). Raises `CheckpointDirInUse` when another live job owns the directory."""
        if self._cleaned:
            return
        if self.rank != 0:
            self._cleaned = True
            return
        if self.exclusive:
            self._owner.acquire()
        self._cleaned = True
        remove_leftovers(self.dir)

    def _host_arena(self, total: int, pinned: bool) -> torch.Tensor:
        arena = self._arena
        if arena is None or arena.numel() < total or (pinned and not arena.is_pinned()):
            # Reused between saves: allocating (and, on CUDA, pinning) GBs each time costs more than the copy.
            self._arena = None
            arena = torch.empty(max(total, 1), dtype=torch.uint8, pin_memory=pinned)
            self._arena = arena
        return arena

    def _device_arena(self, device: torch.device, total: int) -> torch.Tensor | None:
        arena = self._dev_arena
        if arena is None or arena.numel() < total or arena.device != device:
            self._dev_arena = arena = None  # let the old buffer go before taking a larger one
            try:
                arena = torch.empty(max(total, 1), dtype=torch.uint8, device=device)
            except torch.cuda.OutOfMemoryError:
                log.warning(
                    "checkpoint stage='device' needs %.2f GB free on %s; staging to host memory instead",
                    total / 1e9, device,
                )
                return None
            self._dev_arena = arena
        return arena

    def _stage(self, tensors: list[torch.Tensor], total: int, into: torch.Tensor | None = None,
               specs: list[fmt.TensorSpec] | None = None) -> torch.Tensor:
        """Copy `tensors` into an arena at their stream offsets; return the arena's first `total` bytes.

        The arena is pinned host memory (a CPU tensor), or with stage="device" and CUDA tensors a
        device buffer (a CUDA tensor) that the background job copies to host before writing.
        `into`: stage into this CPU buffer instead (a memory-tier slot); `specs`: the stream's
        layout when the caller has planned it."""
        on_cuda = any(t.device.type == "cuda" for t in tensors)
        arena: torch.Tensor | None = into
        if arena is None and on_cuda and self.stage == "device":
            device = next(t.device for t in tensors if t.device.type == "cuda")
            arena = self._device_arena(device, total)
        if arena is None:
            arena = self._host_arena(total, pinned=on_cuda)
        non_blocking = on_cuda and not arena.is_cuda and arena.is_pinned()
        if specs is None:
            specs, _ = fmt.plan_stream(tensors)
        srcs = [t.detach() for t, spec in zip(tensors, specs) if spec.nbytes]
        views = self._arena_views(arena, specs, total)
        if srcs:
            torch._foreach_copy_(views, srcs, non_blocking=non_blocking)
        if on_cuda:
            # The copies ran on the devices' current streams; wait for them (not for a background
            # device-to-host copy on a side stream): the caller may change its tensors from any stream
            # once save() returns.
            for device in {t.device for t in tensors if t.device.type == "cuda"}:
                torch.cuda.current_stream(device).synchronize()
        return arena.narrow(0, 0, total)

    def _arena_views(self, arena: torch.Tensor, specs: list[fmt.TensorSpec], total: int) -> list[torch.Tensor]:
        """The arena's bytes viewed as the tensors of `specs` (empty ones left out), kept for the
        next save of the same layout into the same arena (256 tensors: ~1 ms of Python each time).
        Made anew, the bytes between tensors are zeroed, so a file's bytes (and CRC) depend only on
        the state; no copy writes them, so they stay zero while the views are kept (on a device each
        gap would cost a kernel launch per save). The kept views hold the arena: its address is
        never another buffer's while they live."""
        key = (arena.data_ptr(), arena.numel(), arena.device, tuple(specs))
        if self._views is not None and self._views[0] == key:
            return self._views[1]
        pos = 0
        for spec in specs:
            if spec.offset > pos:
                arena.narrow(0, pos, spec.offset - pos).zero_()
            pos = spec.offset + spec.nbytes
        if total > pos:
            arena.narrow(0, pos, total - pos).zero_()
        views = [arena.narrow(0, s.offset, s.nbytes).view(fmt.dtype_from_name(s.dtype)).view(s.shape)
                 for s in specs if s.nbytes]
        self._views = (key, views)
        return views

    def _to_host(self, staged: torch.Tensor) -> torch.Tensor:
        """A device-staged stream copied into the pinned host arena (in the background job, on a
        side stream so the training loop's stream is not held)."""
        with torch.cuda.device(staged.device):
            host = self._host_arena(staged.numel(), pinned=True).narrow(0, 0, staged.numel())
            if self._d2h_stream is None:
                self._d2h_stream = torch.cuda.Stream()
            stream = self._d2h_stream
            with torch.cuda.stream(stream):
                host.copy_(staged, non_blocking=True)
            stream.synchronize()
        return host

    def _save_plain(self, entries: dict[str, Any], stateful: list[str], step: int,
                    snapshot: "Snapshot | None" = None) -> None:
        if snapshot is not None:  # written from the memory snapshot: no second copy out of the state
            specs, total, meta, staged = snapshot.specs, snapshot.total, snapshot.meta, snapshot.view
        else:
            self._wait_memory()  # a memory commit may still be copying out of the device arena
            tensors: list[torch.Tensor] = []
            structure = st.flatten(entries, tensors, {})
            meta = st.encode_meta({"step": step, "entries": structure, "stateful": stateful})
            specs, total = fmt.plan_stream(tensors)
            staged = self._stage(tensors, total)
        staged_at = time.monotonic()
        final = self.dir / fmt.step_dir_name(step)
        fail = self.take_injected_failure()

        def job() -> None:
            if snapshot is not None and snapshot.ready is not None:
                snapshot.ready.result()  # device staging: the bytes reach the slot in the memory tier's commit
            self._persist_plain(staged, specs, total, meta, step, staged_at, fail)

        self.submit(job, step, final)
        if snapshot is not None and self._memory is not None and self._inflight is not None:
            self._memory.pin(snapshot.slot, self._inflight)  # the slot is not overwritten while it is read

    def tick(self) -> None:
        """Heartbeat from a writer or reader thread (rate-limited)."""
        self.beat()

    def _persist_plain(
        self,
        staged: torch.Tensor,
        specs: list[fmt.TensorSpec],
        total: int,
        meta: bytes,
        step: int,
        staged_at: float,
        fail: str | None = None,
    ) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        name = fmt.step_dir_name(step)
        tmp = self.dir / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}"
        ranges = fmt.split_ranges(total, self.writers)
        recycled = self._reuse_recycled(tmp, {fmt.META, *(f"data-{i}.bin" for i in range(len(ranges)))})
        if not recycled:
            tmp.mkdir()
        try:
            if staged.is_cuda:
                staged = self._to_host(staged)
            view = fmt.byte_view(staged)
            futures = [
                self._pool.submit(write_data_file, tmp / f"data-{i}.bin", view[lo:hi], self.tick)
                for i, (lo, hi) in enumerate(ranges)
            ]
            meta_size, meta_crc = fmt.write_file(tmp / fmt.META, [memoryview(meta)])
            files = {fmt.META: fmt.FileEntry(meta_size, meta_crc)}
            for i, ((lo, hi), fut) in enumerate(zip(ranges, futures)):
                size, crc = fut.result()
                files[f"data-{i}.bin"] = fmt.FileEntry(size, crc, (lo, hi))
            if fail is not None:
                raise RuntimeError(fail)
            manifest = fmt.Manifest(
                "plain", step, files, created=time.time(), world_size=self.world_size, run_id=self.run_id,
                stream_bytes=total, tensors=tuple(specs),
            )
            fmt.write_manifest(tmp / fmt.MANIFEST, manifest)
            fmt.fsync_dir(tmp)
            self.publish(tmp, step)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.events.emit(
            "ckpt_persist", step=step, seconds=round(time.monotonic() - staged_at, 6), bytes=total + len(meta),
            recycled=recycled,
        )
        self._prune_after_durable()

    def publish(self, tmp: Path, step: int) -> Path:
        """Make a complete temp directory visible as `step-<N>` (atomically) and make that durable;
        from then on it counts as verified for pruning."""
        final = self.dir / fmt.step_dir_name(step)
        trash: Path | None = None
        if final.exists():
            # Same step saved again (e.g. after a restart): the old one goes to trash first;
            # rename() cannot replace a non-empty directory.
            trash = self.dir / f".trash-{final.name}-{secrets.token_hex(4)}"
            os.rename(final, trash)
        os.rename(tmp, final)
        fmt.fsync_dir(self.dir)
        self._verified.add(step)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        return final

    def _reuse_recycled(self, tmp: Path, names: set[str]) -> bool:
        """Move a recycled directory to `tmp` for the next write; remove what that write will not
        overwrite. False when none is waiting (the caller makes a fresh directory)."""
        with self._recycle_lock:
            old, self._recycled = self._recycled, None
        if old is None:
            return False
        try:
            os.rename(old, tmp)
        except OSError:
            shutil.rmtree(old, ignore_errors=True)
            return False
        for entry in os.scandir(tmp):
            if entry.name not in names:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
        return True

    def _keep_for_recycling(self, path: Path) -> bool:
        """Hide a checkpoint that is being pruned and keep it for the next write to overwrite."""
        with self._recycle_lock:
            if self._recycled is not None:
                return False
            hidden = self.dir / f".recycle-{secrets.token_hex(4)}"
            try:
                os.rename(path, hidden)
            except OSError:
                return False
            self._recycled = hidden
        return True

    def prune(self, recycle: bool = True) -> int:
        """Keep the newest `keep_last` *verified* checkpoints (published durably by this process or
        verified by its load, so the one it resumed from stays until `keep_last` newer ones are
        durable); remove every step directory older than the oldest kept (with `recycle` the first
        one is hidden and kept for the next write). Newer unverified ones are left alone. Returns
        how many were removed from view."""
        visible = fmt.list_step_dirs(self.dir)
        good = [s for s, _ in visible if s in self._verified]
        if len(good) <= self.keep_last:
            return 0
        removed = 0
        oldest_kept = good[self.keep_last - 1]
        # In place: the next write's publish may add its step meanwhile (another thread).
        self._verified.difference_update([s for s in list(self._verified) if s < oldest_kept])
        for s, p in visible:
            if s < oldest_kept:
                if recycle and self.recycle and self._keep_for_recycling(p):
                    removed += 1
                    continue
                # Rename first so a half-deleted directory is never visible as a checkpoint.
                trash = self.dir / f".trash-{p.name}-{secrets.token_hex(4)}"
                try:
                    os.rename(p, trash)
                except OSError:
                    continue
                shutil.rmtree(trash, ignore_errors=True)
                removed += 1
        return removed

    # --- loading -------------------------------------------------------------------------------

    def load(self, state: MutableMapping[str, Any]) -> int:
        """Restore the newest valid checkpoint into `state` in place; return its step (0: none).

        Each candidate is verified completely (`reader.read`: manifest, step, kind, sizes, CRC32 of
        every file, weights_only meta.pt, fit to `state`) before anything in `state` changes. A
        damaged one is skipped, reported (log, `ckpt_skip`) and moved to `<dir>/.quarantine/`; an
        intact one that does not fit the state raises `CheckpointMismatch`. With torch.distributed
        initialised every rank verifies each candidate and all take the newest step that every
        rank could read (an all-reduce(MIN) of each rank's verdict).

        With the memory tier on, the newest memory snapshot that every rank holds and verifies is
        restored instead when it is at least as new as the newest disk checkpoint (`_load_memory`).
        Either way snapshots newer than the step resumed are invalidated (an abandoned timeline).
        """
        try:
            self.wait()
        except CheckpointError as err:
            log.warning("%s", err)
        self.start()
        candidates = fmt.list_step_dirs(self.dir)
        distributed = _dist_ready() and torch.distributed.get_world_size() > 1
        if distributed:
            # Everyone walks rank 0's list, so all ranks test the same steps in the same order.
            steps = _broadcast_steps([s for s, _ in candidates])
            candidates = [(s, self.dir / fmt.step_dir_name(s)) for s in steps]
        t0 = time.monotonic()
        if self.memory_every:
            step = self._load_memory(state, candidates[0][0] if candidates else 0, distributed)
            if step:
                return step
        step = self._load_disk(state, candidates, distributed)
        tier = self.memory_tier()
        if tier is not None:
            tier.forget_newer(step)
        if step:
            self.events.emit("ckpt_load", step=step, tier="disk", seconds=round(time.monotonic() - t0, 6))
        return step

    def _load_memory(self, state: MutableMapping[str, Any], newest_disk: int, distributed: bool) -> int:
        """Restore the newest memory snapshot every rank holds and verifies, if it is at least as
        new as `newest_disk`; return its step (0: none, load from disk). A rank holds a step in
        its own node's memory or, with replication, in the buddy node's (fetched back over the
        network into a local slot, then verified the same way). Collective when distributed."""
        tier = self.memory_tier()
        t0 = time.monotonic()
        replicated = self.memory_replicate and distributed
        if replicated:  # every rank takes part, so that the collectives match
            addr = agree.buddy_addr_dist(os.environ.get(replica.ADDR_ENV, ""), _buddy_addr)
            if tier is not None:
                tier.replicate_to(addr)
        # A rank whose tier is off still takes part in the collectives (with no snapshots).
        local = tier.steps(self.world_size) if tier is not None else {}
        remote = tier.buddy_steps(self.world_size) if tier is not None and replicated else set()
        mine = sorted(set(local) | remote, reverse=True)
        width = 2 * memdir.SLOTS if replicated else memdir.SLOTS
        steps = agree.common_steps_dist(mine, width) if distributed else mine
        for step in steps:
            if step < newest_disk:
                break
            verified, source, problem = self._verify_memory(tier, step, local, remote, state)
            verdict = _OK if verified is not None else _SKIP
            if distributed:
                verdict = _min_over_ranks(verdict)
            if verdict != _OK:
                reason = f"{type(problem).__name__}: {problem}" if problem else "another rank could not verify it"
                log.warning("skipping memory snapshot step %d: %s", step, reason)
                self.events.emit("ckpt_skip", step=step, reason=f"memory tier: {reason}", quarantined=None)
                if verified is not None and verified.data is not None:
                    verified.data.close()
                continue
            assert verified is not None and tier is not None
            tier.restore(verified, state)
            tier.forget_newer(step)
            self.events.emit("ckpt_load", step=step, tier=source, seconds=round(time.monotonic() - t0, 6),
                             bytes=verified.manifest.stream_bytes)
            return step
        return 0

    @staticmethod
    def _verify_memory(tier: "MemoryTier | None", step: int, local: dict[int, int], remote: set[int],
                       state: MutableMapping[str, Any]) -> tuple[Any, str, Exception | None]:
        """(verified snapshot or None, "memory" or "buddy", the problem): this node's slot first,
        then the buddy's copy fetched back into a local slot."""
        problem: Exception | None = None
        if tier is None:
            return None, "memory", None  # a rank without a tier has no steps, so none are common
        if step in local:
            try:
                return tier.verify(step, local[step], state), "memory", None
            except Exception as err:  # noqa: BLE001 - any failure means: not this copy
                problem = err
        if step in remote:
            try:
                return tier.verify(step, tier.fetch(step), state), "buddy", None
            except Exception as err:  # noqa: BLE001
                problem = err
        return None, "memory", problem

    def _load_disk(self, state: MutableMapping[str, Any], candidates: list[tuple[int, Path]], distributed: bool) -> int:
        for step, path in candidates:
            verified, verdict, problem = self._verify(path, step, state)
            if distributed:
                verdict = _min_over_ranks(verdict)
            if verdict == _MISMATCH:
                raise problem if isinstance(problem, CheckpointMismatch) else CheckpointMismatch(
                    f"checkpoint step {step} in {self.dir} does not fit the state on another rank (see that rank's log)")
            if verdict == _SKIP or verified is None:
                self._reject(step, path, problem)
                continue
            if verified.manifest.kind == "dcp":
                sharded.load_into(path, verified.meta, state)
            else:
                st.restore(state, verified.entries or {}, list(verified.meta["stateful"]))
            self._resumed(verified)
            return step
        return 0

    def _verify(self, path: Path, step: int, state: MutableMapping[str, Any]) -> tuple[reader.Verified | None, int, Exception | None]:
        def verify_dcp(p: Path, m: fmt.Manifest) -> None:
            sharded.verify(p, m, self.rank, self.world_size)

        try:
            return reader.read(path, step, state, self._pool, self.tick, verify_dcp), _OK, None
        except CheckpointMismatch as err:
            return None, _MISMATCH, err
        except Exception as err:  # noqa: BLE001 - any other failure means "do not take this one"
            return None, _SKIP, err

    def _reject(self, step: int, path: Path, err: Exception | None) -> None:
        """Report a checkpoint that will not be loaded; move it aside when this rank found it damaged."""
        moved: Path | None = None
        if err is None:
            reason = "another rank could not read it (see that rank's log)"
        else:
            reason = str(err) if isinstance(err, fmt.CorruptCheckpoint) else f"{type(err).__name__}: {err}"
            if isinstance(err, fmt.CorruptCheckpoint):
                moved = self.quarantine(path, reason)
        where = ""
        if moved is not None:
            where = f"; moved to {moved}" if moved.exists() else \
                f"; deleted (checkpoint.keep_quarantined = {self.keep_quarantined})"
        log.warning("skipping checkpoint %s: %s%s", path, reason, where)
        self.events.emit("ckpt_skip", step=step, reason=reason, quarantined=str(moved) if moved else None)

    def quarantine(self, path: Path, reason: str) -> Path | None:
        """Move a damaged checkpoint to `<dir>/.quarantine/` (never loaded again; inspect or delete
        it by hand) with a `reason.txt`, then keep only the newest `keep_quarantined` there
        (`prune_quarantine`). None if it could not be moved (another rank moved it first, or no
        permission)."""
        dest = self.dir / QUARANTINE / f"{path.name}-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        try:
            dest.parent.mkdir(exist_ok=True)
            os.rename(path, dest)
            fmt.fsync_dir(self.dir)
        except OSError as err:
            if path.exists():
                log.warning("could not move damaged checkpoint %s aside: %s", path, err)
            return None
        try:
            (dest / "reason.txt").write_text(reason + "\n")
        except OSError:
            pass
        self.prune_quarantine()
        return dest

    def prune_quarantine(self) -> int:
        """Delete all but the newest `keep_quarantined` directories of `<dir>/.quarantine/` (newest
        by the time they were moved there: the directory's mtime, set by its reason.txt). Only real
        directories inside `.quarantine/` are considered, never a step directory or a link; returns
        how many were deleted."""
        qdir = self.dir / QUARANTINE
        try:
            if not stat.S_ISDIR(os.lstat(qdir).st_mode):  # a link (to the checkpoint dir?) is never pruned
                log.warning("%s is not a directory: damaged checkpoints there are not pruned", qdir)
                return 0
            entries = [e for e in os.scandir(qdir) if e.is_dir(follow_symlinks=False) and _QUARANTINED.match(e.name)]
        except OSError:
            return 0
        aged = []
        for e in entries:
            try:
                aged.append((e.stat(follow_symlinks=False).st_mtime_ns, e.name))
            except OSError:
                continue  # another rank deleted it meanwhile
        aged.sort(reverse=True)
        removed = 0
        for _, name in aged[self.keep_quarantined:]:
            shutil.rmtree(qdir / name, ignore_errors=True)
            removed += 1
        if removed:
            log.info("deleted %d old damaged checkpoint(s) from %s (checkpoint.keep_quarantined = %d)",
                     removed, qdir, self.keep_quarantined)
        return removed

    def _resumed(self, verified: reader.Verified) -> None:
        step = verified.step
        self.last_saved_step = step
        self._verified.add(step)
        other = verified.manifest.run_id
        if other and self.run_id and other != self.run_id:
            log.warning("resuming from checkpoint step %d in %s, written by another run (%s); this run is %s",
                        step, self.dir, other, self.run_id)
            self.events.emit("ckpt_other_run", step=step, run_id=other, path=str(verified.path))



def _collective_device() -> torch.device:
    # NCCL only reduces CUDA tensors; gloo and others take CPU ones.
    if "nccl" in str(torch.distributed.get_backend()).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast_steps(steps: list[int]) -> list[int]:
    """Rank 0's list of steps, on every rank (tensor collectives: object ones need numpy)."""
    dev = _collective_device()
    n = torch.tensor([len(steps)], dtype=torch.int64, device=dev)
    torch.distributed.broadcast(n, src=0)
    buf = torch.tensor(steps if torch.distributed.get_rank() == 0 else [0] * int(n.item()), dtype=torch.int64, device=dev)
    if buf.numel():
        torch.distributed.broadcast(buf, src=0)
    return [int(s) for s in buf.tolist()]


def _common_steps(local: list[int], width: int = memdir.SLOTS) -> list[int]:
    """The steps every rank has, newest first (each rank gives at most `width`, the same on all)."""
    dev = _collective_device()
    mine = torch.full((width,), -1, dtype=torch.int64, device=dev)
    for i, s in enumerate(local[:width]):
        mine[i] = s
    every = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(every, mine)
    common = set(local)
    for other in every:
        common &= {int(s) for s in other.tolist() if s >= 0}
    return sorted(common, reverse=True)


ADDR_BYTES = 256


def _buddy_addr(own: str) -> str | None:
    """The replica server of this node's buddy (`replica.buddy`), from an all-gather of every
    rank's node (torchelastic's GROUP_RANK) and its node's server address; None if there is none."""
    node = int(os.environ.get("GROUP_RANK", "0"))
    raw = own.encode()[:ADDR_BYTES]
    dev = _collective_device()
    mine = torch.zeros(1 + ADDR_BYTES, dtype=torch.int64, device=dev)
    mine[0] = node
    if raw:
        mine[1 : 1 + len(raw)] = torch.tensor(list(raw), dtype=torch.int64)
    every = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(every, mine)
    addrs: dict[int, str] = {}
    for row in every:
        values = row.tolist()
        text = bytes(v for v in values[1:] if v).decode(errors="replace")
        if text:
            addrs.setdefault(int(values[0]), text)
    target = replica.buddy(node, [int(row[0].item()) for row in every])
    return addrs.get(target) if target is not None else None


def _min_over_ranks(value: int) -> int:
    flag = torch.tensor([value], dtype=torch.int64, device=_collective_device())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
    return int(flag.item())


def remove_leftovers(root: Path) -> int:
    """Remove temp, trash and recycle directories that a killed writer left in `root`; return how many."""
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return 0
    removed = 0
    for entry in entries:
        if entry.name.startswith(LEFTOVERS) and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
    return removed


def write_data_file(path: Path, data: memoryview, tick: Callable[[], None] | None) -> tuple[int, int]:
    """Write one data file (a module-level function so tests can inject a writer failure)."""
    return fmt.write_file(path, [data], tick)
