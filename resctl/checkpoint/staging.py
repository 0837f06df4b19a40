"""Staging: a save's tensors copied into one reusable byte arena at their stream offsets
(`resctl.checkpoint.format`), so the training loop may change them once `stage` returns.

The arena is pinned host memory when any tensor is on CUDA (a CPU tensor), or with
`checkpoint.stage = "device"` a spare device buffer (a device-to-device copy, ~100x faster) that
the background writer copies to pinned host memory (`to_host`). The memory tier stages into its
slot's mapping instead (`into`). Arenas are kept between saves: allocating (and, on CUDA,
pinning) GBs each time costs more than the copy.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

import torch

from resctl.checkpoint import format as fmt

log = logging.getLogger("resctl.checkpoint")


class Staging:
    """One process's staging arenas (host, device) and the views of the last layout staged."""

    def __init__(self, mode: Literal["host", "device"]) -> None:
        self.mode = mode
        self._arena: torch.Tensor | None = None
        self._dev_arena: torch.Tensor | None = None
        self._views: tuple[Any, list[torch.Tensor]] | None = None  # (arena and layout, its tensor views)
        self._d2h_stream: Any = None

    def _host_arena(self, total: int, pinned: bool) -> torch.Tensor:
        arena = self._arena
        if arena is None or arena.numel() < total or (pinned and not arena.is_pinned()):
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

    def stage(self, tensors: list[torch.Tensor], total: int, into: torch.Tensor | None = None,
              specs: list[fmt.TensorSpec] | None = None) -> torch.Tensor:
        """Copy `tensors` into an arena at their stream offsets; return the arena's first `total` bytes.

        `into`: stage into this CPU buffer instead (a memory-tier slot); `specs`: the stream's
        layout when the caller has planned it."""
        on_cuda = any(t.device.type == "cuda" for t in tensors)
        arena: torch.Tensor | None = into
        if arena is None and on_cuda and self.mode == "device":
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

    def views(self) -> list[torch.Tensor]:
        """The arena's views of the layout staged last (its non-empty tensors, in order)."""
        return self._views[1] if self._views is not None else []

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

    def to_host(self, staged: torch.Tensor) -> torch.Tensor:
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
