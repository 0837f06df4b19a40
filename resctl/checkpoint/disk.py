"""The disk tier: persist a staged stream as a checkpoint directory, publish it atomically, prune
old ones (recycling their files), verify a candidate for a load, quarantine damaged ones.

A plain save's write (`persist`, in the write queue's background thread): the stream is cut into
`writers` equal byte ranges; a pool of threads writes one file each with os.write, computing
CRC32 as it goes, and fsyncs it (threads, not a process: os.write and zlib.crc32 release the GIL,
and nothing re-imports the user's `__main__`). Then meta.pt and manifest.json are written and
fsynced, the temp directory is renamed to `step-<N>` and the parent directory fsynced (`publish`);
only then are older checkpoints pruned, on a thread of their own.

Pruning counts only *verified* steps (published durably by this process, or verified by its
load), so damaged or unknown directories never push a good one out.
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
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, Callable, MutableMapping

import torch

from resctl.checkpoint import collectives, reader, sharded
from resctl.checkpoint import format as fmt
from resctl.checkpoint.errors import CheckpointMismatch
from resctl.checkpoint.staging import Staging
from resctl.telemetry.events import EventLog

log = logging.getLogger("resctl.checkpoint")

QUARANTINE = ".quarantine"
_QUARANTINED = re.compile(r"^step-\d+-\d{8}T\d{6}-[0-9a-f]{6}$")  # the names `quarantine` gives
LEFTOVERS = (".tmp-step-", ".trash-", ".recycle-")


class Disk:
    """One process's checkpoint directory: its writer pool, recycled files, verified steps."""

    def __init__(self, root: Path, *, writers: int, keep_last: int, keep_quarantined: int, recycle: bool,
                 events: EventLog, run_id: str, world_size: Callable[[], int], tick: Callable[[], None],
                 staging: Staging) -> None:
        self.dir = root
        self.writers = writers
        self.keep_last = keep_last
        self.keep_quarantined = keep_quarantined
        self.recycle = recycle
        self.events = events
        self.run_id = run_id
        self._world_size = world_size
        self._tick = tick
        self._staging = staging
        self.pool = ThreadPoolExecutor(writers, thread_name_prefix="resctl-ckpt-writer")
        # Pruning runs on its own thread after a checkpoint is durable, so the next save waits for
        # durability only, not for deleting old checkpoints (slow on filesystems mounted with
        # `discard`: ~2.6 s for 6.4 GB on the H200 machine's ext4).
        self._prune_exec = ThreadPoolExecutor(1, thread_name_prefix="resctl-ckpt-prune")
        self._prune_fut: Future[None] | None = None
        #: Seconds the last prune took (diagnostics; None before the first one).
        self.last_prune_s: float | None = None
        # The pruned checkpoint directory waiting to be overwritten by the next write (at most one).
        self._recycled: Path | None = None
        self._recycle_lock = threading.Lock()
        # Steps known good: published durably by this process, or verified by its load.
        self.verified: set[int] = set()

    # --- writing -------------------------------------------------------------------------------

    def persist(self, staged: torch.Tensor, specs: list[fmt.TensorSpec], total: int, meta: bytes, step: int,
                staged_at: float, fail: str | None, prune_now: bool) -> None:
        """Write, verify-stamp and publish checkpoint `step` from `staged`, then prune (now when
        `prune_now`, else on the prune thread). `fail`: a fault drill's message, raised once the
        data is written (no manifest: never visible)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        name = fmt.step_dir_name(step)
        tmp = self.dir / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}"
        ranges = fmt.split_ranges(total, self.writers)
        recycled = self._reuse_recycled(tmp, {fmt.META, *(f"data-{i}.bin" for i in range(len(ranges)))})
        if not recycled:
            tmp.mkdir()
        futures: list[Future[tuple[int, int]]] = []
        try:
            if staged.is_cuda:
                staged = self._staging.to_host(staged)
            view = fmt.byte_view(staged)
            futures += [
                self.pool.submit(write_data_file, tmp / f"data-{i}.bin", view[lo:hi], self._tick)
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
                "plain", step, files, created=time.time(), world_size=self._world_size(), run_id=self.run_id,
                stream_bytes=total, tensors=tuple(specs),
            )
            fmt.write_manifest(tmp / fmt.MANIFEST, manifest)
            fmt.fsync_dir(tmp)
            self.wait_prune()  # the previous save's prune first: at most keep_last + 1 visible, whatever kills it
            self.publish(tmp, step)
        except BaseException:
            # The data files' writers first: one still writing (the metadata failed first, e.g. ENOSPC) would
            # create a file in `tmp` while rmtree walks it, and the half-written directory would stay.
            wait(futures)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.events.emit(
            "ckpt_persist", step=step, seconds=round(time.monotonic() - staged_at, 6), bytes=total + len(meta),
            recycled=recycled,
        )
        self.prune_after_durable(prune_now)

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
        self.verified.add(step)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
        return final

    # --- pruning and recycling -----------------------------------------------------------------

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
        how many were removed from view. With exactly `keep_last` verified ones, the older (a
        previous process's, not verified by this one) go too: otherwise a job killed after each
        restart's first save would keep one more checkpoint every restart."""
        visible = fmt.list_step_dirs(self.dir)
        good = [s for s, _ in visible if s in self.verified]
        if len(good) < self.keep_last:
            return 0
        removed = 0
        oldest_kept = good[self.keep_last - 1]
        # In place: the next write's publish may add its step meanwhile (another thread).
        self.verified.difference_update([s for s in list(self.verified) if s < oldest_kept])
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

    def prune_after_durable(self, now: bool) -> None:
        """Prune now (a synchronous save), else on the prune thread (one at a time, in order)."""
        if now:
            self._timed_prune()
            return
        self._prune_fut = self._prune_exec.submit(self._timed_prune)

    def _timed_prune(self) -> None:
        t0 = time.monotonic()
        removed = self.prune()
        self.last_prune_s = time.monotonic() - t0
        if removed:
            self.events.emit("ckpt_prune", removed=removed, seconds=round(self.last_prune_s, 6))

    def wait_prune(self) -> None:
        fut, self._prune_fut = self._prune_fut, None
        if fut is not None:
            try:
                fut.result()
            except Exception:
                log.warning("pruning old checkpoints in %s failed", self.dir, exc_info=True)

    # --- loading -------------------------------------------------------------------------------

    def verify(self, path: Path, step: int, state: MutableMapping[str, Any], rank: int,
               world_size: int) -> tuple[reader.Verified | None, int, Exception | None]:
        """(verified checkpoint or None, this rank's verdict, the problem) for candidate `path`."""
        def verify_dcp(p: Path, m: fmt.Manifest) -> None:
            sharded.verify(p, m, rank, world_size)

        try:
            return reader.read(path, step, state, self.pool, self._tick, verify_dcp), collectives.OK, None
        except CheckpointMismatch as err:
            return None, collectives.MISMATCH, err
        except Exception as err:  # noqa: BLE001 - any other failure means "do not take this one"
            return None, collectives.SKIP, err

    def reject(self, step: int, path: Path, err: Exception | None) -> None:
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

    # --- lifecycle -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the threads; give back a recycled directory nobody will overwrite now."""
        self.pool.shutdown(wait=True)
        self._prune_exec.shutdown(wait=True)
        self.drop_recycled()

    def drop_recycled(self) -> None:
        """Remove the pruned checkpoint kept for the next write to overwrite: nobody will now (the
        script ended, or `close`), and a whole checkpoint must not be left behind in a hidden directory."""
        with self._recycle_lock:
            waiting, self._recycled = self._recycled, None
        if waiting is not None:
            shutil.rmtree(waiting, ignore_errors=True)


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
