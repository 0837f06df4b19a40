"""A memory-tier slot: one checkpoint directory in host shared memory and the writable mapping of
its data file, kept between snapshots (`resctl.checkpoint.memory` holds two per rank), and the
mappings a restore reads.
"""

from __future__ import annotations

import logging
import mmap
import os
from pathlib import Path
from typing import Any

import torch

from resctl.checkpoint import format as fmt
from resctl.checkpoint import memdir

log = logging.getLogger("resctl.checkpoint.memory")
DATA = "data-0.bin"


class Slot:
    """One slot's directory and the writable mapping of its data file (kept between saves)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._map: mmap.mmap | None = None
        self._view: torch.Tensor | None = None
        self._size = -1
        self._pinned = False
        #: What a user of the mapping derived from it and keeps between snapshots (the sharded save's
        #: DTensor wrappers of its views, `sharded.Saver`): dropped with the mapping, never outliving it.
        self.memo: dict[str, Any] = {}

    def manifest(self) -> fmt.Manifest | None:
        try:
            return fmt.read_manifest(self.path / fmt.MANIFEST)
        except fmt.CorruptCheckpoint:
            return None

    def ready(self, total: int, pin: bool) -> bool:
        """Mapped for `total` bytes (and registered with CUDA if `pin`) already."""
        return self._view is not None and self._size == total and (self._pinned or not pin or total == 0)

    def would_cut(self, total: int) -> bool:
        """Mapping it for `total` bytes would cut the complete snapshot it holds (one of another size)."""
        try:
            return (self.path / fmt.MANIFEST).exists() and (self.path / DATA).stat().st_size != total
        except OSError:
            return False

    def invalidate(self) -> None:
        """Remove the manifest: from now on the slot is incomplete (never offered to a load)."""
        try:
            os.unlink(self.path / fmt.MANIFEST)
        except FileNotFoundError:
            pass

    def buffer(self, total: int, pin: bool = False) -> torch.Tensor:
        """The data file mapped as `total` writable bytes (preallocated: a full /dev/shm raises
        OSError here instead of killing the process with SIGBUS on a write into the mapping);
        `pin`: registered with CUDA as page-locked memory (device copies at full speed)."""
        if self._view is not None and self._size == total:
            if pin and not self._pinned:
                self._register()
            return self._view
        self.close()
        memdir.ensure_private(self.path)  # 0700 and this user's, or refused: never another user's link
        fd = os.open(self.path / DATA, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            if os.fstat(fd).st_size != total:
                os.ftruncate(fd, 0)
                if total:
                    os.posix_fallocate(fd, 0, total)
            length = max(total, 1)
            if total == 0:
                os.ftruncate(fd, 1)  # mmap cannot map an empty file
            self._map = map_shared(fd, length)
        finally:
            os.close(fd)
        if total == 0:
            os.truncate(self.path / DATA, 0)
            self._map.close()
            self._map = None
            self._view = torch.empty(0, dtype=torch.uint8)
        else:
            self._view = torch.frombuffer(self._map, dtype=torch.uint8)
        self._size = total
        if pin and total:
            self._register()
        return self._view

    def _register(self) -> None:
        """cudaHostRegister the mapping (once); without it a device-to-host copy into it runs at
        pageable speed. Failing to register only costs speed."""
        assert self._view is not None
        err = torch.cuda.cudart().cudaHostRegister(self._view.data_ptr(), self._view.numel(), 0)
        if int(err) != 0:
            log.warning("could not register the memory-tier slot %s with CUDA (error %s): device copies run at "
                        "pageable-memory speed", self.path, err)
            return
        self._pinned = True

    def detach(self) -> None:
        """The live state now uses this slot's pages (a zero-copy restore): remove the files, so
        the next snapshot here makes a new one, and drop this process's old mapping of them."""
        self.invalidate()
        try:
            os.unlink(self.path / DATA)
        except FileNotFoundError:
            pass
        self.close()

    def close(self) -> None:
        self.memo.clear()  # before the unmap: views of it would keep it mapped
        if self._pinned and self._view is not None:
            torch.cuda.cudart().cudaHostUnregister(self._view.data_ptr())
        self._pinned = False
        self._view = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still exported (a disk write in flight): the GC closes it
                pass
            self._map = None
        self._size = -1


def map_shared(fd: int, size: int) -> mmap.mmap:
    # MAP_POPULATE: the page tables in one pass, not one fault per 4 KiB page (~5x faster here).
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def map_snapshot(path: Path, size: int) -> mmap.mmap | None:
    """A slot's data file mapped writable (a zero-copy restore hands its pages to the state).
    Not populated: the parallel checksum threads fault the pages in, each its own part (measured
    here: 0.11-0.16 s for 1 GiB against 0.17-0.19 s populating first)."""
    if size == 0:
        return None
    fd = os.open(path, os.O_RDWR)
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def release_pages(data: mmap.mmap | None, specs: list[fmt.TensorSpec]) -> None:
    """Give back the shared pages of tensors that were copied out (the file is already unlinked)."""
    remove = getattr(mmap, "MADV_REMOVE", None)
    if data is None or remove is None:
        return
    page = mmap.PAGESIZE
    for spec in specs:
        lo = -(-spec.offset // page) * page
        hi = (spec.offset + spec.nbytes) // page * page
        if hi > lo:
            try:
                data.madvise(remove, lo, hi - lo)
            except OSError:
                return


def bytes_of(data: mmap.mmap | None) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8) if data is None else torch.frombuffer(data, dtype=torch.uint8)


def unmap(data: mmap.mmap) -> None:
    try:
        data.close()
    except BufferError:  # a view of it is still alive: the GC unmaps it with the view
        pass
