"""A sharded (DCP) checkpoint loaded into a state whose tensors are not yet those it saved.

DCP loads in place: each tensor of the checkpoint needs a tensor of its shape (a DTensor with this
rank's placement) to read into. The first version took them from the state as it is now, in
flatten order, and that order is the checkpoint's only when the state already holds every tensor the
checkpoint does. A restarted job's state does not: a torch optimizer creates its state (Adam's `step`,
`exp_avg`, `exp_avg_sq`) at its first step, and the data position entry has no tensors before the
loader's first pass; every FSDP2 restart failed on every rank (IndexError in `unflatten`).

Here each of the checkpoint's tensors gets its target by *path* in the saved structure: the state's
tensor at the same path when it has the saved global shape and dtype, else a new one: zeros like the
parameter an optimizer state belongs to (the same DTensor placement: this rank reads its shards only)
when the shapes agree, else a plain tensor of the saved shape and dtype (read whole: a scalar `step`,
a position's counters). torch's own `torch.distributed.checkpoint.state_dict` makes the optimizer state
with a zero-learning-rate step instead; that step would run the optimizer's hooks (the shim would count
a training step). The restore then goes through `load_state_dict` as for a plain checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, MutableMapping

import torch

from resctl.checkpoint import state as st


def load_into(path: Path, meta: Mapping[str, Any], state: MutableMapping[str, Any]) -> None:
    """Collective: read checkpoint `path` (verified, its `meta.pt` decoded) into `state` in place."""
    import torch.distributed.checkpoint as dcp

    reader = dcp.FileSystemReader(str(path))
    shapes = reader.read_metadata().state_dict_metadata

    def saved(index: int) -> tuple[tuple[int, ...], torch.dtype | None]:
        info = shapes.get(key(index))
        return tuple(getattr(info, "size", ()) or ()), getattr(getattr(info, "properties", None), "dtype", None)

    def fits(index: int, t: torch.Tensor) -> bool:
        return (tuple(t.shape), t.dtype) == saved(index)

    def plain(index: int) -> torch.Tensor:
        size, dtype = saved(index)
        return torch.zeros(size, dtype=dtype)

    found = choose(meta["entries"], state, fits, lambda i: saved(i)[1], plain)
    flat = {key(i): t for i, t in found.items()}
    dcp.load(flat, storage_reader=reader)
    tensors = [found[i] for i in range(max(found, default=-1) + 1)]
    st.restore(state, st.unflatten(meta["entries"], tensors), list(meta["stateful"]))


def key(index: int) -> str:
    """The DCP key of the checkpoint's tensor `index` (checkpoint/sharded.py writes `{"t0": ..., ...}`)."""
    return f"t{index}"


def choose(saved: Mapping[str, Any], state: Mapping[str, Any], fits: Callable[[int, torch.Tensor], bool],
           dtype_of: Callable[[int], torch.dtype | None], plain: Callable[[int], torch.Tensor] | None,
           ) -> dict[int, torch.Tensor]:
    """A target for each tensor of a saved structure, by path: the state's tensor there when it `fits`, else
    zeros like the parameter an optimizer state belongs to (its DTensor placement) when those fit, else
    `plain(index)` (None: no target; the memory tier's restore makes such tensors from the snapshot)."""
    targets = Targets(fits, dtype_of, plain)
    current, _ = st.snapshot_entries(state)
    for name, structure in saved.items():
        targets.entry(structure, current.get(name), _params_by_id(state.get(name)))
    return targets.found


class Targets:
    """Walks a saved structure beside the state's current one, choosing a target per tensor index."""

    def __init__(self, fits: Callable[[int, torch.Tensor], bool], dtype_of: Callable[[int], torch.dtype | None],
                 plain: Callable[[int], torch.Tensor] | None) -> None:
        self.fits = fits
        self.dtype_of = dtype_of
        self.plain = plain
        self.found: dict[int, torch.Tensor] = {}

    def entry(self, saved: Any, current: Any, params: Mapping[Any, torch.Tensor]) -> None:
        """One entry of the state; `params`: an optimizer's parameters by their state dict id."""
        if not (params and isinstance(saved, Mapping) and isinstance(saved.get("state"), Mapping)):
            self.walk(saved, current)
            return
        now = current.get("state") if isinstance(current, Mapping) else None
        for pid, per_param in saved["state"].items():
            self.walk(per_param, now.get(pid) if isinstance(now, Mapping) else None, params.get(pid))
        self.walk({k: v for k, v in saved.items() if k != "state"}, current)

    def walk(self, saved: Any, current: Any, like: torch.Tensor | None = None) -> None:
        if st.is_placeholder(saved):
            self._choose(saved[1], current, like)
        elif isinstance(saved, Mapping):
            for k, v in saved.items():
                self.walk(v, current.get(k) if isinstance(current, Mapping) else None, like)
        elif isinstance(saved, (list, tuple)):
            for i, v in enumerate(saved):
                fits = isinstance(current, (list, tuple)) and i < len(current)
                self.walk(v, current[i] if fits else None, like)

    def _choose(self, index: int, current: Any, like: torch.Tensor | None) -> None:
        if index in self.found:
            return  # a tensor saved once for two places (tied weights)
        if isinstance(current, torch.Tensor) and self.fits(index, current):
            self.found[index] = current
            return
        if like is not None:
            made = torch.zeros_like(like, dtype=self.dtype_of(index) or like.dtype, requires_grad=False)
            if self.fits(index, made):
                self.found[index] = made
                return
        if self.plain is not None:
            self.found[index] = self.plain(index)


def _params_by_id(value: Any) -> dict[Any, torch.Tensor]:
    """An optimizer's parameters by the ids its state dict names them with ({} for anything else)."""
    if not isinstance(value, torch.optim.Optimizer):
        return {}
    ids = [pid for group in value.state_dict()["param_groups"] for pid in group["params"]]
    return dict(zip(ids, (p for group in value.param_groups for p in group["params"])))
