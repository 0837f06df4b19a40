"""The memory tier as the engine uses it: this rank's `MemoryTier` (created on first use, turned
off for the process by a failed snapshot), its snapshots, and the load from this node's memory or
the buddy node's copy (`resctl.checkpoint.replica`).

The load (`load`) is collective when distributed: every rank finds its buddy's server, lists the
steps it holds locally and at the buddy, and the ranks take the newest step every rank holds and
verifies, if it is at least as new as the newest disk checkpoint (a MIN over the ranks' verdicts,
`resctl.checkpoint.collectives`). A rank whose tier is off still takes part, with no steps.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Callable, Literal, MutableMapping

import torch

from resctl import slots
from resctl.checkpoint import agree, collectives, memdir, replica
from resctl.checkpoint import state as st
from resctl.checkpoint.memory import MemoryTier, Snapshot, Verified
from resctl.checkpoint.staging import Staging
from resctl.telemetry.events import EventLog

log = logging.getLogger("resctl.checkpoint")


class MemoryTiers:
    """This process's memory tier, for the rank it is now (an in-process restart may renumber)."""

    def __init__(self, *, every: int, replicate: bool, stage: Literal["host", "device"], run_id: str, root: Path,
                 events: EventLog, rank: Callable[[], int], world_size: Callable[[], int], staging: Staging) -> None:
        self.every = every
        self.replicate = replicate
        self.stage = stage
        self.run_id = run_id
        self.root = root
        self.events = events
        self._rank = rank
        self._world_size = world_size
        self._staging = staging
        self._memory: MemoryTier | None = None
        #: Why this process stopped taking memory snapshots (a failed one), or None.
        self.off: str | None = None
        self._meta = st.MetaEncoder()  # meta.pt; the weights_only check once per structure

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def at_step(self, state: MutableMapping[str, Any], step: int) -> Snapshot | None:
        """The end of step `step`: snapshot if it is due, then, if the next step ends in a
        snapshot and the newest commit is still in flight, hold that step's forward until it
        lands (back-pressure, `MemoryTier.hold_if_committing`: the only wait a commit causes)."""
        snap = self.save(state, step) if self.due(step) else None
        if self.due(step + 1) and self._memory is not None and self.off is None:
            self._memory.hold_if_committing()
        return snap

    def tier(self) -> MemoryTier | None:
        """This rank's memory tier (created on first use), or None when off or turned off."""
        if not self.every or self.off is not None:
            return None
        tier = self._memory
        if tier is not None and tier.rank != self._rank():  # an in-process restart renumbered the ranks
            tier.close()
            tier = self._memory = None
        if tier is None:
            tier = self._memory = MemoryTier(memdir.job_key(self.run_id, self.root), self._rank(), run_id=self.run_id,
                                             events=self.events)
        return tier

    # --- saving --------------------------------------------------------------------------------

    def save(self, state: MutableMapping[str, Any], step: int) -> Snapshot | None:
        """Snapshot `state` into the memory tier (blocks for the copy only); None if it could not."""
        tier = self.tier()
        if tier is None:
            return None
        entries, stateful = st.snapshot_entries(state)
        tensors: list[torch.Tensor] = []
        try:
            structure = st.flatten(entries, tensors, {}, sharded_ok=True)
            parts, local = st.local_parts(tensors)  # a DTensor: this rank's shard of it
            meta = self._meta.encode(step, structure, stateful, local)
            snap, _ = tier.save(parts, meta, step, self._staging.stage, on_device=self.stage == "device")
        except Exception as err:  # noqa: BLE001 - the disk tier goes on; the memory tier stops
            self.turn_off(err)
            return None
        return snap

    def pin(self, slot: int, fut: Future[None]) -> None:
        """A disk write reads `slot` until `fut` is done (the slot is not overwritten meanwhile)."""
        if self._memory is not None:
            self._memory.pin(slot, fut)

    def turn_off(self, err: BaseException) -> None:
        log.warning("memory-tier snapshots turned off in this process (%s: %s); disk checkpoints go on",
                    type(err).__name__, err)
        self.events.emit("ckpt_mem_off", error=f"{type(err).__name__}: {err}")
        if self._memory is not None:
            self._memory.close()
            self._memory = None
        self.off = f"{type(err).__name__}: {err}"

    def wait(self) -> None:
        """Until the snapshot in flight is committed (a failed commit turns the tier off)."""
        if self._memory is not None:
            try:
                self._memory.wait()
            except Exception as err:  # noqa: BLE001 - an uncommitted snapshot is never offered
                self.turn_off(err)

    def release(self) -> None:
        """Remove this rank's snapshots (the script finished cleanly: nothing will restore them)."""
        if self._memory is not None:
            self._memory.release()
            self._memory = None
        elif self.every:
            memdir.release_rank(memdir.job_key(self.run_id, self.root), self._rank())

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()

    # --- loading -------------------------------------------------------------------------------

    def forget_newer(self, step: int) -> None:
        """The job resumes from `step` (from disk): snapshots newer than it are an abandoned timeline."""
        tier = self.tier()
        if tier is not None:
            tier.forget_newer(step)

    def load(self, state: MutableMapping[str, Any], newest_disk: int, distributed: bool) -> int:
        """Restore the newest memory snapshot every rank holds and verifies, if it is at least as
        new as `newest_disk`; return its step (0: none, load from disk). A rank holds a step in
        its own node's memory or, with replication, in the buddy node's (fetched back over the
        network into a local slot, then verified the same way). Collective when distributed."""
        tier = self.tier()
        t0 = time.monotonic()
        replicated = self.replicate and distributed
        if replicated:  # every rank takes part, so that the collectives match
            own = os.environ.get(replica.ADDR_ENV, "")
            # host:port through the store (readable by whoever reaches it), the secret only through
            # the job's own collective.
            where = agree.buddy_addr_dist(replica.shown(own), collectives.buddy_addr)
            secret = collectives.buddy_secret(replica.secret_of(own))
            addr = replica.with_secret(where, secret) if where else where
            if tier is not None:
                tier.replicate_to(addr)
        world = self._world_size()
        local = tier.steps(world) if tier is not None else {}
        remote = tier.buddy_steps(world) if tier is not None and replicated else set()
        mine = sorted(set(local) | remote, reverse=True)
        steps = agree.common_steps_dist(mine, slots.compared_steps(replicated)) if distributed else mine
        for step in steps:
            if step < newest_disk:
                break
            verified, source, problem = _verify(tier, step, local, remote, state)
            verdict = collectives.OK if verified is not None else collectives.SKIP
            if distributed:
                verdict = collectives.min_over_ranks(verdict)
            if verdict != collectives.OK:
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


def _verify(tier: MemoryTier | None, step: int, local: dict[int, int], remote: set[int],
            state: MutableMapping[str, Any]) -> tuple[Verified | None, str, Exception | None]:
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
