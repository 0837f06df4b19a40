"""The checkpoint engine's façade: the order and policy of a save and a load, over its parts.

One `Checkpointer` per process. Its one input is the profile's `[checkpoint]` section
(`resctl.checkpoint.settings`: every default and check lives in the schema). The parts:

- `staging.Staging`   a save's tensors copied into a reusable arena (pinned host, or device);
- `writes.Writes`     one background write in flight, the failed-save policy, fault drills;
- `disk.Disk`         persist (parallel CRC'd writers), atomic publish, prune (recycling the
                      files), verify a candidate, quarantine damaged ones;
- `tiers.MemoryTiers` the memory tier in /dev/shm and the buddy node's copies;
- `collectives`       what the ranks agree on when they load;
- `loading`           the disk half of a load: the newest candidate every rank verifies;
- `rankside`          entries that differ per rank (data positions), one file per rank beside
                      rank 0's checkpoint;
- `hooks.Hooks`       the driver's seam (the shim): heartbeats, loaded, the final save's gate.

A save: wait for the previous write, stage (the loop may go on), write in the background,
publish, prune. A load: the memory tier's newest snapshot every rank holds, when at least as new
as the newest disk checkpoint; else the newest disk checkpoint every rank verifies.

Why not NVRx's `TorchAsyncCheckpoint`: it fails on CPU-only torch (torch.cuda.synchronize), it
writes with a single `torch.save` (~30 % of a disk's multi-writer bandwidth on the H200), and
its spawned persistent process re-imports `__main__` and keeps staging memory alive. Our arena
plus thread pool keeps the same contract (stage, return, write in the background) on CPU and GPU.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, MutableMapping

import torch

from resctl.checkpoint import collectives, loading, rankside, sharded
from resctl.checkpoint import format as fmt
from resctl.checkpoint import settings as settings_mod
from resctl.checkpoint import state as st
from resctl.checkpoint.disk import LEFTOVERS, QUARANTINE, Disk, remove_leftovers
from resctl.checkpoint.errors import CheckpointError, CheckpointMismatch, SaveFailuresExceeded
from resctl.checkpoint.hooks import Final, Hooks, NoHooks
from resctl.checkpoint.owner import Ownership
from resctl.checkpoint.settings import Settings
from resctl.checkpoint.staging import Staging
from resctl.checkpoint.tiers import MemoryTiers
from resctl.checkpoint.writes import Heartbeat, Writes
from resctl.telemetry.events import NULL_LOG, EventLog

if TYPE_CHECKING:
    from resctl.checkpoint.memory import MemoryTier, Snapshot

log = logging.getLogger("resctl.checkpoint")

__all__ = ["LEFTOVERS", "QUARANTINE", "CheckpointError", "CheckpointMismatch", "Checkpointer",
           "SaveFailuresExceeded", "current_run_id", "remove_leftovers"]


def current_run_id() -> str:
    """The job's run id (the launcher's rendezvous id: the same in every worker and restart), or ""."""
    return os.environ.get("TORCHELASTIC_RUN_ID", "")


class Checkpointer:
    """Async, atomic, verified checkpoints of a `state` dict into `settings.dir`.

    Args:
        settings: the `[checkpoint]` section (defaults: the schema's); keyword `options` (the
            schema's names: `dir`, `interval_steps`, `async_`, `keep_last`, `writers`, `stage`,
            `recycle`, `max_failed_saves`, `memory_every`, `memory_replicate`,
            `keep_quarantined`, ...) override it and are validated by the schema. See
            README.md "Profile reference" (generated from the schema: `profile.render`) or
            `resctl profile show` for what each does.
        rank, world_size: default to torch.distributed when initialised, else env RANK /
            WORLD_SIZE, else 0 / 1 (looked up at every call: in-process restarts may renumber).
        events: an `EventLog` for `ckpt_stall`, `ckpt_persist`, `ckpt_prune`, `ckpt_skip`, ...
        hooks: the driver's seam (`resctl.checkpoint.hooks.Hooks`; the shim's).
        heartbeat: without `hooks`, a zero-argument callable called before and after each save
            and, at most once a second, from the writer threads (it must be thread-safe).
        run_id: written into every manifest, so a resume from another run's checkpoint is
            reported (`ckpt_other_run`); default: env TORCHELASTIC_RUN_ID.
        exclusive: rank 0 holds an flock on `<dir>/.resctl-owner` from its first load or save, and
            another live process owning the directory raises `CheckpointDirInUse`.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        events: EventLog | None = None,
        hooks: Hooks | None = None,
        heartbeat: Callable[[], None] | None = None,
        run_id: str | None = None,
        exclusive: bool = True,
        **options: Any,
    ) -> None:
        self.settings = s = settings_mod.build(settings, **options)
        self.dir = Path(s.dir)
        self._rank = rank
        self._world_size = world_size
        self.events = events if events is not None else NULL_LOG
        self.hooks: Hooks = hooks if hooks is not None else NoHooks(heartbeat)
        self.run_id = current_run_id() if run_id is None else run_id
        self.exclusive = exclusive
        self.heartbeat = Heartbeat(hooks.heartbeat if hooks is not None else heartbeat)
        self.writes = Writes(async_=s.async_, max_failed_saves=s.max_failed_saves, events=self.events,
                             heartbeat=self.heartbeat, run_id=self.run_id, rank=lambda: self.rank, where=self.dir)
        self.staging = Staging(s.stage)
        self.disk = Disk(self.dir, writers=s.writers, keep_last=s.keep_last, keep_quarantined=s.keep_quarantined,
                         recycle=s.recycle, events=self.events, run_id=self.run_id,
                         world_size=lambda: self.world_size, tick=self.writes.tick, staging=self.staging)
        self.memory = MemoryTiers(every=s.memory_every, replicate=s.memory_replicate, stage=s.stage,
                                  run_id=self.run_id, root=self.dir, events=self.events, rank=lambda: self.rank,
                                  world_size=lambda: self.world_size, staging=self.staging)
        self._owner = Ownership(self.dir, self.run_id)
        self._sharded = sharded.Saver()
        self._cleaned = False
        self._latest: tuple[MutableMapping[str, Any], int] | None = None
        self._final = Final.NONE
        self._final_deadline: float | None = None
        #: Set once a final save requested by `request_final_save` is durable (or was skipped).
        self.final_done = threading.Event()

    @classmethod
    def from_section(cls, section: Settings, **kw: Any) -> Checkpointer:
        """A Checkpointer from a profile's `[checkpoint]` section; `kw` adds rank, events, hooks, ..."""
        return cls(section, **kw)

    # --- settings and identity -----------------------------------------------------------------

    @property
    def interval_steps(self) -> int:
        return self.settings.interval_steps

    @property
    def keep_last(self) -> int:
        return self.settings.keep_last

    @property
    def writers(self) -> int:
        return self.settings.writers

    @property
    def stage(self) -> str:
        return self.settings.stage

    @property
    def memory_every(self) -> int:
        return self.settings.memory_every

    @property
    def max_failed_saves(self) -> int:
        return self.settings.max_failed_saves

    @property
    def async_(self) -> bool:
        """Whether saves return once staged (a final save is synchronous whatever this says)."""
        return self.writes.async_

    @async_.setter
    def async_(self, value: bool) -> None:
        self.writes.async_ = value

    @property
    def rank(self) -> int:
        if self._rank is not None:
            return self._rank
        if collectives.ready():
            return torch.distributed.get_rank()
        return int(os.environ.get("RANK", "0"))

    @property
    def world_size(self) -> int:
        if self._world_size is not None:
            return self._world_size
        if collectives.ready():
            return torch.distributed.get_world_size()
        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def last_saved_step(self) -> int | None:
        """The step last saved (or being written) or resumed; None before, or after its write failed."""
        return self.writes.last_saved_step

    @property
    def failed_in_a_row(self) -> int:
        """Writes that failed since the last one that landed."""
        return self.writes.failed_in_a_row

    @property
    def last_prune_s(self) -> float | None:
        """Seconds the last prune took (diagnostics; None before the first one)."""
        return self.disk.last_prune_s

    def beat(self, force: bool = False) -> None:
        """Call the heartbeat (at most once a second unless `force`); never raises."""
        self.heartbeat.beat(force)

    # --- saving --------------------------------------------------------------------------------

    def save(self, state: MutableMapping[str, Any], step: int, snapshot: Snapshot | None = None) -> None:
        """Save `state` as checkpoint `step`.

        Waits for the previous save first (the wait is reported as `waited` in `ckpt_stall`),
        and reports it if that save failed (raises `SaveFailuresExceeded` only at
        `max_failed_saves` failures in a row). With async on, returns once the state is staged;
        otherwise once it is durable (or failed). `snapshot`: a memory snapshot of this state at
        this step, written to disk as it is (no second copy out of the state).
        """
        t0 = time.monotonic()
        waited = self.writes.begin()
        entries, stateful = st.snapshot_entries(state)
        self.start()
        self.writes.last_saved_step = step  # cleared by the failed-save policy if the write fails
        if any(st.is_sharded(t) for t in st.find_tensors(entries)):
            _save_sharded(self, entries, stateful, step, rankside.names(state) if self.rank else [],
                          snapshot if snapshot is not None and snapshot.step == step else None)
        elif self.rank == 0:
            self._save_plain(entries, stateful, step, snapshot if snapshot is not None and snapshot.step == step else None)
        else:  # rank 0's copy of replicated state is everyone's; what differs per rank goes beside it
            self._save_own(entries, rankside.names(state), step)
        blocked = time.monotonic() - t0
        self.events.emit("ckpt_stall", step=step, seconds=round(blocked, 6), waited=round(waited, 6))
        self.writes.end()

    def _save_plain(self, entries: dict[str, Any], stateful: list[str], step: int,
                    snapshot: Snapshot | None = None) -> None:
        if snapshot is not None:  # written from the memory snapshot: no second copy out of the state
            specs, total, meta, staged = snapshot.specs, snapshot.total, snapshot.meta, snapshot.view
        else:
            self.memory.wait()  # a memory commit may still be copying out of the device arena
            tensors: list[torch.Tensor] = []
            structure = st.flatten(entries, tensors, {})
            meta = st.encode_meta({"step": step, "entries": structure, "stateful": stateful})
            specs, total = fmt.plan_stream(tensors)
            staged = self.staging.stage(tensors, total)
        staged_at = time.monotonic()
        final = self.dir / fmt.step_dir_name(step)
        fail = self.writes.take_injected_failure()

        def job() -> None:
            if snapshot is not None and snapshot.ready is not None:
                snapshot.ready.result()  # device staging: the bytes reach the slot in the memory tier's commit
            self.disk.persist(staged, specs, total, meta, step, staged_at, fail, prune_now=not self.writes.async_)

        self.writes.submit(job, step, final)
        inflight = self.writes.inflight
        if snapshot is not None and inflight is not None:
            self.memory.pin(snapshot.slot, inflight)  # the slot is not overwritten while it is read

    def _save_own(self, entries: dict[str, Any], names: list[str], step: int) -> None:
        """A rank > 0's per-rank entries (`rankside`): in place now, durable in the background."""
        if not names:
            return
        try:
            path = rankside.write_entries(self.dir, entries, names, step=step, rank=self.rank,
                                          world_size=self.world_size, run_id=self.run_id)
        except OSError as err:  # a full or broken disk: the failed-save policy, as for rank 0's write
            self.writes.record_failure(step, err)
            return

        def job() -> None:
            rankside.sync(path)
            rankside.prune(self.dir, self.rank)

        self.writes.submit(job, step, None)

    def maybe_save(self, state: MutableMapping[str, Any], step: int) -> bool:
        """Save when `step % interval_steps == 0`; always remember (state, step) for `save_final`.

        After `request_final_save()`, the next call (a step boundary) that the hooks' `final_gate`
        allows runs `save_final()` instead, whatever the interval, sets `final_done` and calls the
        hooks' `after_final`.
        """
        self._latest = (state, step)
        if self._final is Final.REQUESTED and self.hooks.final_gate(step):
            return self._final_boundary()
        snap = self.memory.at_step(state, step)
        if step % self.settings.interval_steps == 0:
            self.save(state, step, snapshot=snap)
            return True
        return False

    def _final_boundary(self) -> bool:
        self._final = Final.NONE
        try:
            deadline = self._final_deadline
            if deadline is None or time.monotonic() < deadline:
                self.save_final()
            else:
                log.warning("final checkpoint skipped: the SIGTERM grace period is over")
                self.wait()
        finally:
            if self._final is Final.NONE:
                self._final = Final.DONE
            self.final_done.set()
            self.hooks.after_final()
        return True

    @property
    def final_state(self) -> Final:
        return self._final

    @property
    def latest_step(self) -> int | None:
        """The step last given to `maybe_save` (None before the first call)."""
        latest = self._latest
        return None if latest is None else latest[1]

    @property
    def tracks_state(self) -> bool:
        """Whether the script has called `maybe_save` (so a final save at a step boundary can come)."""
        return self._latest is not None

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
            saved_async, self.writes.async_ = self.writes.async_, False
            try:
                self.save(state, step)
            finally:
                self.writes.async_ = saved_async
        return step

    def request_final_save(self, deadline: float | None = None) -> None:
        """Ask for a final synchronous save at the next `maybe_save` (safe from a signal handler:
        it only sets flags). `deadline` is a `time.monotonic()` value after which the final save
        is skipped; `final_done` is set when it is over either way."""
        self._final_deadline = deadline
        self._final = Final.REQUESTED

    def fail_next_write(self, message: str) -> None:
        """Fault drill: make the next background write fail part-way (data written, no manifest)
        with `message`; the failure surfaces on the following save()/wait() like a real one."""
        self.writes.fail_next_write(message)

    # --- the memory tier -----------------------------------------------------------------------

    def memory_tier(self) -> MemoryTier | None:
        """This rank's memory tier (created on first use), or None when off or turned off."""
        return self.memory.tier()

    @property
    def memory_off(self) -> str | None:
        """Why this process stopped taking memory snapshots (a failed one), or None."""
        return self.memory.off

    def save_memory(self, state: MutableMapping[str, Any], step: int) -> Snapshot | None:
        """Snapshot `state` into the memory tier (blocks for the copy only); None if it could not."""
        return self.memory.save(state, step)

    def release_memory(self) -> None:
        """Remove this rank's memory snapshots (the script finished cleanly: nothing will restore them)."""
        self.memory.release()

    # --- waiting and lifecycle -----------------------------------------------------------------

    def wait(self) -> None:
        """Block until the in-flight write is durable and old checkpoints are pruned; raise
        `CheckpointError` if the write failed."""
        try:
            self.writes.wait_previous()
        finally:
            self.disk.wait_prune()
            self.memory.wait()

    def pending_path(self) -> Path | None:
        """The final path of the write in flight, if any (the torch.save tracker asks)."""
        return self.writes.pending_path()

    def close(self) -> None:
        """Finish writes and stop the threads."""
        try:
            self.wait()
        finally:
            self.writes.close()
            self._sharded.close()
            self.disk.close()
            self.memory.close()
            self._owner.release()

    def drop_recycled(self) -> None:
        """The script ended: no write of this process will reuse the pruned checkpoint kept for it."""
        self.disk.drop_recycled()

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

    def prune(self, recycle: bool = True) -> int:
        """Keep the newest `keep_last` verified checkpoints (`Disk.prune`); return how many went."""
        return self.disk.prune(recycle)

    def quarantine(self, path: Path, reason: str) -> Path | None:
        """Move a damaged checkpoint to `<dir>/.quarantine/` (`Disk.quarantine`)."""
        return self.disk.quarantine(path, reason)

    def prune_quarantine(self) -> int:
        """Keep the newest `keep_quarantined` damaged checkpoints (`Disk.prune_quarantine`)."""
        return self.disk.prune_quarantine()

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
        restored instead when it is at least as new as the newest disk checkpoint (`tiers`).
        Either way snapshots newer than the step resumed are invalidated (an abandoned timeline).
        The hooks' `loaded(step, seconds)` is called when it returns.
        """
        t0 = time.monotonic()
        step = self._load(state)
        self.hooks.loaded(step, time.monotonic() - t0)
        return step

    def _load(self, state: MutableMapping[str, Any]) -> int:
        try:
            self.wait()
        except CheckpointError as err:
            log.warning("%s", err)
        self.start()
        candidates = fmt.list_step_dirs(self.dir)
        distributed = collectives.several()
        if distributed:
            # Everyone walks rank 0's list, so all ranks test the same steps in the same order.
            steps = collectives.broadcast_steps([s for s, _ in candidates])
            candidates = [(s, self.dir / fmt.step_dir_name(s)) for s in steps]
        t0 = time.monotonic()
        if self.memory.every:
            step = self.memory.load(state, candidates[0][0] if candidates else 0, distributed)
            if step:
                if self.rank:
                    rankside.forget_newer(self.dir, self.rank, step)
                return step
        step = self._load_disk(state, candidates, distributed)
        self.memory.forget_newer(step)
        if self.rank:
            rankside.forget_newer(self.dir, self.rank, step)
        if step:
            self.events.emit("ckpt_load", step=step, tier="disk", seconds=round(time.monotonic() - t0, 6))
        return step

    def _load_disk(self, state: MutableMapping[str, Any], candidates: list[tuple[int, Path]], distributed: bool) -> int:
        found = loading.from_disk(self.disk, state, candidates, distributed, self.rank, self.world_size)
        if found is None:
            return 0
        step, verified = found
        self._resumed(verified.step, verified.manifest.run_id, verified.path)
        return step

    def _resumed(self, step: int, other: str, path: Path) -> None:
        self.writes.last_saved_step = step
        self.disk.verified.add(step)
        if other and self.run_id and other != self.run_id:
            log.warning("resuming from checkpoint step %d in %s, written by another run (%s); this run is %s",
                        step, self.dir, other, self.run_id)
            self.events.emit("ckpt_other_run", step=step, run_id=other, path=str(path))


def _save_sharded(ck: Checkpointer, entries: dict[str, Any], stateful: list[str], step: int, own: list[str],
                  snap: Snapshot | None) -> None:
    """`Checkpointer.save` of a sharded state. Collective: every rank stages its shards now (or takes `snap`'s,
    a memory snapshot of this step: no second copy) and writes them in the background when async (`sharded`);
    a failure goes through the policy on every rank. `own`: a rank > 0's per-rank entries (`rankside`)."""
    staged = ck._sharded.stage(entries, stateful, step,
                               sharded.FromSnapshot(snap.view, snap.specs, snap.memo) if snap is not None else None)
    fail, side = ck.writes.take_injected_failure(), None  # a rank that failed to stage fails the write on all
    try:
        side = rankside.write_entries(ck.dir, entries, own, step=step, rank=ck.rank, world_size=ck.world_size,
                                      run_id=ck.run_id) if own else None
    except OSError as err:  # a full or broken disk: this rank fails the collective write, every rank reports it
        fail = fail or f"{type(err).__name__}: {err}"
    staged_at = time.monotonic()

    def job() -> None:
        if snap is not None and snap.ready is not None:
            snap.ready.result()  # device staging: the bytes reach the slot in the memory tier's commit
        total = sharded.write(ck.dir, staged, writers=ck.writers, beat=ck.beat, publish=ck.disk.publish,
                              run_id=ck.run_id, fail=fail)
        if side is not None:
            rankside.sync(side)
            rankside.prune(ck.dir, ck.rank)
        if total is not None:
            ck.events.emit("ckpt_persist", step=step, seconds=round(time.monotonic() - staged_at, 6), bytes=total)
            ck.disk.prune(recycle=False)  # only the plain writer overwrites recycled files

    ck.writes.submit(job, step, ck.dir / fmt.step_dir_name(step))
    if snap is not None and ck.writes.inflight is not None:
        ck.memory.pin(snap.slot, ck.writes.inflight)  # the slot is not overwritten while it is read
