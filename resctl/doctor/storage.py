"""Storage probe: the checkpoint directory's file system, free space, write+fsync+read
throughput with parallel writers, and Lustre health.

The directory is `checkpoint.dir` (or `resctl doctor --dir`). When it does not exist yet, the
nearest existing parent is tested, as that is where it will be created.

Verdicts:
  mount        WARN tmpfs (checkpoints in RAM vanish with the pod), or a node-local file system
               (ext4, xfs, overlay, ...) for a multi-node job (a rescheduled node cannot load).
  space        FAIL free space < checkpoint_size_gb x (keep_last + 1): the newest checkpoint is
               written before the oldest is pruned. Without a size: WARN under 5 % free.
  write        FAIL below the throughput the checkpoints need: doctor.min_storage_gbps, or
               checkpoint_size_gb / checkpoint_every (an async write must finish before the next
               starts). FAIL when the directory is not writable.
  direct       measured only: the same bytes written with O_DIRECT (what the storage sustains;
               comparable with dd oflag=direct and fio). Far above `write`: the host's page-cache
               writeback is the bottleneck of buffered checkpoint writes.
  read         measured only (restore speed after a fault).
  lustre       FAIL /sys/fs/lustre/health_check says anything but "healthy".

The throughput test writes `doctor.storage_test_mb` MB of incompressible data with
`checkpoint.writers` threads (one file each, 8 MiB writes), fsyncs every file and the directory,
and reports bytes / wall time from the first write to the last fsync. It then drops the files
from the page cache (posix_fadvise DONTNEED) and reads them back with the same threads, with
O_DIRECT where the file system allows it, so the read is not served from memory. Last, it writes
the same bytes again with O_DIRECT into fresh files.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from resctl.doctor.context import Context
from resctl.doctor.result import Check, Status, gb

CHUNK = 8 << 20
LOCAL_FS = {"ext2", "ext3", "ext4", "xfs", "btrfs", "overlay", "zfs", "f2fs", "vfat", "tmpfs", "ramfs"}
HEALTH = ("/sys/fs/lustre/health_check", "/proc/fs/lustre/health_check")


@dataclass(frozen=True)
class Mount:
    device: str
    point: str
    fstype: str


@dataclass(frozen=True)
class Throughput:
    """One write+fsync+read test. Rates in decimal GB/s.

    `write_s` is the buffered path checkpoints take (write, then fsync); `direct_s` the same bytes
    written with O_DIRECT (what the storage itself sustains, as `dd oflag=direct` or fio measure),
    None where the file system refuses O_DIRECT. A large gap means the host's page-cache
    writeback, not the storage, limits checkpoint writes.
    """

    bytes: int
    writers: int
    write_s: float
    read_s: float
    read_method: str  # "O_DIRECT" or "fadvise" (page cache dropped, buffered read)
    direct_s: float | None = None

    @property
    def write_gbps(self) -> float:
        return self.bytes / self.write_s / 1e9

    @property
    def read_gbps(self) -> float:
        return self.bytes / self.read_s / 1e9

    @property
    def direct_gbps(self) -> float | None:
        return self.bytes / self.direct_s / 1e9 if self.direct_s else None


class Cancelled(Exception):
    pass


def find_mount(mounts_text: str, path: str) -> Mount | None:
    """The /proc/mounts entry whose mount point is the longest prefix of `path`."""
    best: Mount | None = None
    for line in mounts_text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        # /proc/mounts escapes spaces and tabs in octal
        point = parts[1].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
        inside = point == "/" or path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best.point)):
            best = Mount(parts[0], point, parts[2])
    return best


def measure(directory: Path, total_bytes: int, writers: int,
            progress: Callable[[str, int, int], None] | None = None,
            cancel: threading.Event | None = None, direct: bool = True) -> Throughput:
    """Write `total_bytes` into `directory` with `writers` threads, fsync, read it back, and
    (with `direct`) write it again with O_DIRECT into fresh files.

    Files are created in a fresh subdirectory, which is removed afterwards. Every phase is timed
    from its first byte to the last thread's fsync (or read) returning.

    Raises:
        OSError: the directory is not writable or the disk filled up.
    """
    bench = _Bench(directory, total_bytes, max(1, writers), progress, cancel)
    try:
        write_s = bench.parallel(bench.writer(0, "write"))
        _fsync_dir(bench.work)
        bench.drop_cache()
        read_s = bench.parallel(bench.read)
        direct_s = bench.direct_write() if direct else None
        return Throughput(bench.total, bench.writers, write_s, read_s, bench.read_method, direct_s)
    finally:
        bench.close()


class _Bench:
    """One `measure`: its files (whole 4 KiB blocks each, so the O_DIRECT phase writes exactly the same
    bytes), its incompressible page-aligned buffer, the bytes done in the current phase, the threads' errors."""

    def __init__(self, directory: Path, total_bytes: int, writers: int,
                 progress: Callable[[str, int, int], None] | None, cancel: threading.Event | None) -> None:
        self.writers, self.progress, self.cancel = writers, progress, cancel
        self.per = max(4096, math.ceil(total_bytes / writers / 4096) * 4096)
        self.chunk = min(CHUNK, self.per)
        self.total = self.per * writers
        self.aligned = mmap.mmap(-1, self.chunk)  # page-aligned, as O_DIRECT requires
        self.aligned.write(os.urandom(self.chunk))  # incompressible: compressing file systems must not flatter it
        self.data = memoryview(self.aligned)
        self.work = Path(tempfile.mkdtemp(prefix=".resctl-doctor-", dir=directory))
        self.files = [self.work / f"w{i}.bin" for i in range(writers)]
        self.done = 0
        self.lock = threading.Lock()
        self.errors: list[BaseException] = []
        self.read_method = "O_DIRECT"

    def tick(self, phase: str, n: int) -> None:
        with self.lock:
            self.done += n
            now = self.done
        if self.progress is not None:
            self.progress(phase, now, self.total)

    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.is_set():
            raise Cancelled()

    def parallel(self, fn: Callable[[Path], None]) -> float:
        """Run `fn` on every file, one thread each; seconds until the last returned (a thread's error raised)."""
        self.done = 0
        threads = [threading.Thread(target=_guard(fn, self.errors), args=(f,), daemon=True) for f in self.files]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        if self.errors:
            raise self.errors[0]
        return elapsed

    def writer(self, flags: int, phase: str) -> Callable[[Path], None]:
        def write(path: Path) -> None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flags, 0o600)
            try:
                left = self.per
                while left:
                    self.check_cancel()
                    n = os.write(fd, self.data[: min(self.chunk, left)])
                    left -= n
                    self.tick(phase, n)
                os.fsync(fd)
            finally:
                os.close(fd)
        return write

    def read(self, path: Path) -> None:
        buf = mmap.mmap(-1, self.chunk)  # page-aligned, as O_DIRECT requires
        fd = -1
        try:
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0))
                n = os.readv(fd, [buf])
            except OSError:  # tmpfs and some FUSE file systems refuse O_DIRECT
                if fd >= 0:
                    os.close(fd)
                fd = os.open(path, os.O_RDONLY)
                self.read_method = "fadvise"
                n = os.readv(fd, [buf])
            while n > 0:
                self.tick("read", n)
                self.check_cancel()
                n = os.readv(fd, [buf])
        finally:
            if fd >= 0:
                os.close(fd)
            buf.close()

    def drop_cache(self) -> None:
        """The page cache forgets the files written, so the read phase reads the disk."""
        for f in self.files:
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)

    def direct_write(self) -> float | None:
        """The O_DIRECT write into fresh files; None where the OS or the file system has no O_DIRECT."""
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            return None
        for f in self.files:
            f.unlink()
        try:
            return self.parallel(self.writer(flag, "write O_DIRECT"))
        except OSError as err:
            if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            self.errors.clear()  # this file system refuses O_DIRECT: no device number, not an error
            return None

    def close(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        self.data.release()
        self.aligned.close()


def _fsync_dir(path: Path) -> None:
    dfd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _guard(fn: Callable[[Path], None], errors: list[BaseException]) -> Callable[[Path], None]:
    def run(path: Path) -> None:
        try:
            fn(path)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(err)
    return run


def run(ctx: Context) -> list[Check]:
    target = ctx.checkpoint_dir
    existing = target
    while not ctx.path(existing).is_dir() and existing not in ("/", ""):
        existing = os.path.dirname(existing.rstrip("/")) or "/"
    note = "" if existing == target else f" ({target} does not exist yet; tested {existing})"
    real = os.path.realpath(existing) if ctx.live else existing
    checks = [_mount(ctx, real, note)]
    checks.append(_space(ctx, existing))
    checks += _throughput(ctx, existing, checks[-1])
    lustre = _lustre(ctx, checks[0])
    if lustre is not None:
        checks.append(lustre)
    return checks


def _mount(ctx: Context, path: str, note: str) -> Check:
    text = ctx.read("/proc/mounts")
    mount = find_mount(text, path) if text else None
    if mount is None:
        return Check("mount", Status.SKIP, f"no /proc/mounts entry for {path}{note}")
    where = f"{mount.fstype} {mount.device} on {mount.point}{note}"
    if mount.fstype in ("tmpfs", "ramfs"):
        return Check("mount", Status.WARN, f"checkpoints in RAM: {where}", mount.fstype, "shared storage", "",
                     "point checkpoint.dir at persistent shared storage (e.g. FSx for Lustre)")
    if ctx.expect.multi_node and mount.fstype in LOCAL_FS:
        return Check("mount", Status.WARN, f"node-local file system for a multi-node job: {where}", mount.fstype,
                     "shared storage", "", "a rescheduled node cannot load these checkpoints: use shared storage "
                     "(FSx for Lustre, NFS) for checkpoint.dir")
    return Check("mount", Status.PASS, where, mount.fstype)


def _space(ctx: Context, path: str) -> Check:
    try:
        space = ctx.space(path)
    except OSError as err:
        return Check("space", Status.SKIP, f"cannot stat {path}: {err}")
    size, keep = ctx.expect.checkpoint_size_gb, ctx.expect.keep_last
    free = gb(space.free)
    if size:
        need = size * (keep + 1)
        if space.free / 1e9 < need:
            return Check("space", Status.FAIL, f"{free} GB free, {need:g} GB needed ({size:g} GB x (keep_last {keep} "
                         "+ 1 being written))", free, need, "GB",
                         "free space, grow the file system, or lower checkpoint.keep_last")
        return Check("space", Status.PASS, f"{free} GB free of {gb(space.total)} GB; {need:g} GB needed", free, need,
                     "GB")
    if space.total and space.free < 0.05 * space.total:
        return Check("space", Status.WARN, f"{free} GB free of {gb(space.total)} GB (under 5 %)", free, None, "GB",
                     "free space; set doctor.checkpoint_size_gb for an exact check")
    return Check("space", Status.PASS, f"{free} GB free of {gb(space.total)} GB (set doctor.checkpoint_size_gb to "
                 "check against the checkpoints)", free, None, "GB")


def _throughput(ctx: Context, path: str, space: Check) -> list[Check]:
    mb = ctx.expect.storage_test_mb
    if mb <= 0:
        return [Check("write", Status.SKIP, "doctor.storage_test_mb = 0")]
    total = mb * 1_000_000
    if space.status == Status.FAIL:
        return [Check("write", Status.SKIP, "not writing test data to a file system without room for the checkpoints")]
    if isinstance(space.measured, (int, float)) and space.measured * 1e9 < 2 * total:
        return [Check("write", Status.SKIP, f"less than {2 * mb} MB free: no room for the throughput test")]
    progress = ctx.progress
    try:
        result = measure(ctx.path(path), total, ctx.expect.writers,
                         (lambda phase, done, of: progress(f"storage {phase}", done, of)) if progress else None,
                         ctx.cancel)
    except Cancelled:
        return [Check("write", Status.FAIL, "throughput test did not finish in time", None, None, "GB/s",
                      "the storage is very slow or hung: check its health")]
    except OSError as err:
        return [Check("write", Status.FAIL, f"cannot write to {path}: {err.strerror or err}", None, None, "GB/s",
                      "make checkpoint.dir writable by this user (fsGroup / permissions) and check the mount")]
    need = ctx.expect.needed_storage_gbps
    how = f"{result.writers} writers, {result.bytes / 1e6:.0f} MB, write+fsync"
    w = round(result.write_gbps, 3)
    if need is not None and result.write_gbps < need:
        why = (f"{ctx.expect.checkpoint_size_gb:g} GB every {ctx.expect.checkpoint_every_s:g} s"
               if ctx.expect.checkpoint_size_gb and ctx.expect.checkpoint_every_s else "doctor.min_storage_gbps")
        write = Check("write", Status.FAIL, f"{w} GB/s ({how}) < {need:.3g} GB/s needed ({why})", w, round(need, 3),
                      "GB/s", "checkpoint less often or smaller, add storage throughput (FSx: more capacity or a "
                      "higher throughput tier), or lower the expectation")
    else:
        write = Check("write", Status.PASS, f"{w} GB/s ({how})" + (f" >= {need:.3g} GB/s needed" if need else ""), w,
                      round(need, 3) if need else None, "GB/s")
    r = round(result.read_gbps, 3)
    read = Check("read", Status.PASS, f"{r} GB/s ({result.writers} readers, {result.read_method})", r, None, "GB/s")
    d = result.direct_gbps
    if d is None:
        device = Check("direct", Status.SKIP, "the file system refuses O_DIRECT")
    else:
        gap = " (page-cache writeback, not the storage, limits buffered writes)" if d > 1.5 * result.write_gbps else ""
        device = Check("direct", Status.PASS, f"{d:.3f} GB/s with O_DIRECT, as dd oflag=direct / fio measure{gap}",
                       round(d, 3), None, "GB/s")
    return [write, device, read]


def _lustre(ctx: Context, mount: Check) -> Check | None:
    for path in HEALTH:
        text = ctx.read(path)
        if text is not None:
            state = text.strip()
            if state.lower() == "healthy":
                return Check("lustre", Status.PASS, f"{path}: healthy", state, "healthy")
            return Check("lustre", Status.FAIL, f"{path}: {state[:80]}", state[:40], "healthy", "",
                         "the Lustre client is unhealthy (LBUG/evicted): remount or replace the node")
    if mount.measured == "lustre":
        return Check("lustre", Status.SKIP, "Lustre mount but no health_check file readable")
    return None
