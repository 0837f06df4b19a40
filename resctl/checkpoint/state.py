"""Turning a training `state` dict into (structure, tensors) and back.

`state` maps names to values. A value with `state_dict()`/`load_state_dict()` (a module, an
optimizer, a scheduler, a sampler) is saved through `state_dict()` and restored through
`load_state_dict()`; any other value (an int, a dict of tensors, an RNG state) is saved as is and
replaced on load. Inside the saved structure every tensor becomes a placeholder
`("__resctl_tensor__", index)`; the structure is small and goes to `meta.pt`, the tensors go to
the data files.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from typing import Any, Mapping, MutableMapping

import torch

from resctl.checkpoint.format import TENSOR_MARK

#: The zero-edit data position's entry (resctl.checkpoint.dataposition). Optional on both sides: a
#: checkpoint without it loads into a state with it and the other way round (the option was turned on
#: or off between runs); it is never put into a state that does not ask for it.
DATA_POSITION = "__resctl_data_position__"
OPTIONAL_ENTRIES = frozenset({DATA_POSITION})


class UnsupportedState(TypeError):
    """A value resctl cannot save with weights_only-safe loading (the message names where it is)."""


def is_stateful(value: Any) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(getattr(value, "load_state_dict", None))


def is_sharded(t: torch.Tensor) -> bool:
    """True for tensors that only make sense per rank (DTensor, ShardedTensor)."""
    name = type(t).__name__
    return name in ("DTensor", "ShardedTensor")


def snapshot_entries(state: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`state` with stateful values replaced by their state_dict(); also the names of those."""
    if not isinstance(state, Mapping):
        raise UnsupportedState(f"state must be a dict of name -> value, not {type(state).__name__}")
    entries: dict[str, Any] = {}
    stateful: list[str] = []
    for name, value in state.items():
        if is_stateful(value):
            entries[str(name)] = value.state_dict()
            stateful.append(str(name))
        else:
            entries[str(name)] = value
    return entries, stateful


def flatten(
    obj: Any, tensors: list[torch.Tensor], seen: dict[int, int], where: str = "state", sharded_ok: bool = False
) -> Any:
    """Replace every tensor in `obj` by a placeholder, appending it to `tensors` (each distinct
    tensor object once, so tied weights are written once)."""
    if isinstance(obj, torch.Tensor):
        if is_sharded(obj):
            if not sharded_ok:
                raise UnsupportedState(f"{where}: sharded tensor in the plain path")
        elif obj.is_sparse or obj.is_quantized or obj.layout != torch.strided:
            raise UnsupportedState(f"{where}: only dense (strided) tensors are supported, got {obj.layout}")
        idx = seen.get(id(obj))
        if idx is None:
            idx = seen[id(obj)] = len(tensors)
            tensors.append(obj)
        return (TENSOR_MARK, idx)
    if isinstance(obj, Mapping):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = flatten(v, tensors, seen, f"{where}.{k}", sharded_ok)
        return out
    if isinstance(obj, list):
        return [flatten(v, tensors, seen, f"{where}[{i}]", sharded_ok) for i, v in enumerate(obj)]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(flatten(v, tensors, seen, f"{where}[{i}]", sharded_ok) for i, v in enumerate(obj))
    return obj


def local_part(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (`to_local()`, no copy), else `t`."""
    return t.to_local() if is_sharded(t) and hasattr(t, "to_local") else t


def local_parts(tensors: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[int]]:
    """Each DTensor replaced by this rank's part of it (`to_local()`, no copy), and the indices of
    those: what a rank keeps of a sharded state in its own memory (the memory tier). A
    ShardedTensor (FSDP1's sharded state dict) is refused: its local shards are a list."""
    out: list[torch.Tensor] = []
    local: list[int] = []
    for i, t in enumerate(tensors):
        if type(t).__name__ == "ShardedTensor":
            raise UnsupportedState("a ShardedTensor (FSDP1's sharded state dict) in the memory tier: use FSDP2 "
                                   "(DTensor) or a local/full state dict; disk checkpoints take it as it is")
        if is_sharded(t):
            out.append(t.to_local())  # type: ignore[attr-defined]
            local.append(i)
        else:
            out.append(t)
    return out, local


def is_placeholder(obj: Any) -> bool:
    return isinstance(obj, tuple) and len(obj) == 2 and obj[0] == TENSOR_MARK and isinstance(obj[1], int)


def placeholder_indices(obj: Any) -> list[int]:
    """Every tensor index a saved structure refers to."""
    found: list[int] = []
    stack = [obj]
    while stack:
        cur = stack.pop()
        if is_placeholder(cur):
            found.append(cur[1])
        elif isinstance(cur, Mapping):
            stack.extend(cur.values())
        elif isinstance(cur, (list, tuple)):
            stack.extend(cur)
    return found


def unflatten(obj: Any, tensors: list[torch.Tensor]) -> Any:
    if is_placeholder(obj):
        return tensors[obj[1]]
    if isinstance(obj, Mapping):
        out = OrderedDict() if isinstance(obj, OrderedDict) else {}
        for k, v in obj.items():
            out[k] = unflatten(v, tensors)
        return out
    if isinstance(obj, list):
        return [unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(unflatten(v, tensors) for v in obj)
    return obj


def find_tensors(obj: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, torch.Tensor):
            found.append(cur)
        elif isinstance(cur, Mapping):
            stack.extend(cur.values())
        elif isinstance(cur, (list, tuple)):
            stack.extend(cur)
    return found


def encode_meta(meta: dict[str, Any], check: bool = True) -> bytes:
    """torch.save `meta` to bytes, refusing anything that weights_only loading would reject: an
    unloadable checkpoint is better reported at save time than discovered at restart. `check=False`:
    the caller knows an equal structure passed."""
    buf = io.BytesIO()
    torch.save(meta, buf)
    data = buf.getvalue()
    if not check:
        return data
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, ...
        raise UnsupportedState(
            "the state holds a value that torch.load(weights_only=True) refuses; keep checkpoint "
            "state to tensors, containers and plain values (or register the type with "
            f"torch.serialization.add_safe_globals): {err}"
        ) from None
    return data


class MetaEncoder:
    """meta.pt for the successive saves of one state: the weights_only check (a decode) only for a
    structure unlike the last one that passed (a save every step would otherwise pay a decode each time)."""

    def __init__(self) -> None:
        self._checked: tuple[Any, list[str], list[int] | None] | None = None

    def encode(self, step: int, structure: Any, stateful: list[str], local: list[int] | None = None) -> bytes:
        """`local`: the indices of tensors saved as this rank's part of a DTensor (`local_parts`)."""
        meta: dict[str, Any] = {"step": step, "entries": structure, "stateful": stateful}
        if local:
            meta["local"] = local
        seen = (structure, stateful, local)
        if self._checked is not None and self._checked == seen:
            return encode_meta(meta, check=False)
        data = encode_meta(meta)
        self._checked = seen
        return data


def decode_meta(data: bytes) -> dict[str, Any]:
    meta = torch.load(io.BytesIO(data), weights_only=True)
    if not isinstance(meta, dict):
        raise ValueError("meta.pt does not hold a dict")
    return meta


def restore(state: MutableMapping[str, Any], entries: Mapping[str, Any], stateful: list[str]) -> None:
    """Put loaded `entries` into `state` in place."""
    for name, value in entries.items():
        if name in OPTIONAL_ENTRIES and name not in state:
            continue
        current = state.get(name)
        if name in stateful and current is not None and is_stateful(current):
            current.load_state_dict(value)
        else:
            state[name] = value
