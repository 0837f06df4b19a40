"""Verified reading of one checkpoint directory; nothing in the caller's state changes here.

`read(path, dir_step, state, ...)` checks, in this order, and stops at the first failure:

1. the manifest: checksum, format, every field's type and the plain layout (`format.Manifest`);
2. the step: the directory name, the manifest and meta.pt must say the same step;
3. the kind: a plain state loads only plain checkpoints and a sharded state only DCP ones, so a
   plain state never reads DCP's pickled `.metadata` (`CheckpointMismatch` otherwise);
4. every file present with the manifest's size; CRC32 and weights_only loading of meta.pt;
5. the fit: every name, shape and dtype in the checkpoint against the state it goes into
   (`CheckpointMismatch`, before a byte of tensor data is read);
6. the data (plain): every data file read in parallel into buffers the reader owns, CRC32
   compared. When one file fails, the others are cancelled and *joined* before the error is
   raised, and every buffer view holds a reference to its buffer: no thread can write into memory
   that nobody owns. The caller's tensors are touched only by `state.restore` afterwards.

Damage raises `format.CorruptCheckpoint`; a checkpoint that is intact but does not fit the state
raises `CheckpointMismatch`.
"""

from __future__ import annotations

import threading
import zlib
from concurrent.futures import Executor, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from resctl.checkpoint import format as fmt
from resctl.checkpoint import state as st
from resctl.checkpoint.errors import CheckpointMismatch


@dataclass
class Verified:
    """A checkpoint that passed every check: `entries` (plain) are ready for `state.restore`;
    a DCP one is loaded collectively afterwards (`shardtargets.load_into`)."""

    path: Path
    manifest: fmt.Manifest
    meta: dict[str, Any]
    entries: dict[str, Any] | None = None

    @property
    def step(self) -> int:
        return int(self.manifest.step or 0)


def read(
    path: Path,
    dir_step: int,
    state: Mapping[str, Any],
    pool: Executor,
    tick: Callable[[], None] | None = None,
    verify_dcp: Callable[[Path, fmt.Manifest], None] | None = None,
) -> Verified:
    manifest = fmt.read_manifest(path / fmt.MANIFEST)
    if manifest.checksum != "crc32":
        raise fmt.CorruptCheckpoint(f"a {manifest.checksum} manifest: memory-tier snapshots are not disk checkpoints")
    if manifest.step != dir_step:
        raise fmt.CorruptCheckpoint(f"directory says step {dir_step}, its manifest says step {manifest.step}")
    current, _ = st.snapshot_entries(state)
    sharded_state = any(st.is_sharded(t) for t in st.find_tensors(current))
    want = "dcp" if sharded_state else "plain"
    if manifest.kind != want:
        raise CheckpointMismatch(
            f"checkpoint {path} is a {manifest.kind} checkpoint but the state is {want} "
            f"({'has' if sharded_state else 'has no'} sharded tensors); point checkpoint.dir at a new directory "
            "or load it with the state layout that wrote it"
        )
    check_sizes(path, manifest)
    meta_bytes = (path / fmt.META).read_bytes()
    if zlib.crc32(meta_bytes) != manifest.files[fmt.META].crc32:
        raise fmt.CorruptCheckpoint(f"{fmt.META}: checksum mismatch")
    meta = decode_meta(meta_bytes, manifest)
    if manifest.kind == "dcp":
        if verify_dcp is not None:
            verify_dcp(path, manifest)
        return Verified(path, manifest, meta)
    problems = fit_problems(meta["entries"], manifest.tensors, current)
    if problems:
        raise CheckpointMismatch(
            f"checkpoint {path} (step {dir_step}) does not fit the state: " + "; ".join(problems[:5])
            + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else "")
            + ". The directory holds another model's checkpoints: point checkpoint.dir at a new directory, "
            "or run the code that wrote them"
        )
    tensors = _read_data(path, manifest, pool, tick)
    return Verified(path, manifest, meta, st.unflatten(meta["entries"], tensors))


def check_sizes(path: Path, manifest: fmt.Manifest) -> None:
    for name, entry in manifest.files.items():
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            raise fmt.CorruptCheckpoint(f"missing file {name}") from None
        if size != entry.bytes:
            raise fmt.CorruptCheckpoint(f"{name}: {size} bytes, manifest says {entry.bytes}")


def decode_meta(data: bytes, manifest: fmt.Manifest) -> dict[str, Any]:
    try:
        meta = st.decode_meta(data)
    except Exception as err:  # noqa: BLE001 - torch raises UnpicklingError, RuntimeError, ...
        raise fmt.CorruptCheckpoint(f"{fmt.META} refused by weights_only loading: {err}") from None
    if not isinstance(meta.get("entries"), dict) or not isinstance(meta.get("stateful"), list):
        raise fmt.CorruptCheckpoint(f"{fmt.META}: not a resctl state structure")
    if meta.get("step") != manifest.step:
        raise fmt.CorruptCheckpoint(f"{fmt.META} says step {meta.get('step')}, the manifest says {manifest.step}")
    if manifest.kind == "plain":
        bad = [i for i in st.placeholder_indices(meta["entries"]) if not 0 <= i < len(manifest.tensors)]
        if bad:
            raise fmt.CorruptCheckpoint(f"{fmt.META} refers to tensors the manifest does not list: {bad[:3]}")
    return meta


def fit_problems(saved: Mapping[str, Any], specs: tuple[fmt.TensorSpec, ...], current: Mapping[str, Any]) -> list[str]:
    """Where an intact checkpoint's structure disagrees with the state: top-level names, a
    module's parameter names, and the shape and dtype of every tensor found at the same place in
    both (an optimizer's per-parameter state may be absent before its first step)."""
    problems: list[str] = []
    if set(saved) - st.OPTIONAL_ENTRIES != set(current) - st.OPTIONAL_ENTRIES:
        problems.append(f"names: saved {sorted(saved)}, state has {sorted(current)}")
    for name in saved.keys() & current.keys():
        _fit(saved[name], current[name], specs, name, problems, strict=_is_module_dict(current[name]))
    return problems


def _is_module_dict(value: Any) -> bool:
    # A module's state_dict is an OrderedDict of tensors; load_state_dict(strict) wants the same keys.
    return isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values())


def _fit(saved: Any, current: Any, specs: tuple[fmt.TensorSpec, ...], where: str, problems: list[str], strict: bool) -> None:
    if st.is_placeholder(saved):
        spec = specs[saved[1]]
        if isinstance(current, torch.Tensor):
            # A DTensor's snapshot (the memory tier's) holds this rank's part of it.
            have = (fmt.dtype_name(current.dtype), tuple(st.local_part(current).shape))
            if have != (spec.dtype, spec.shape):
                problems.append(f"{where}: saved {spec.dtype} {list(spec.shape)}, state has {have[0]} {list(have[1])}")
        elif isinstance(current, (Mapping, list, tuple)):
            problems.append(f"{where}: saved a tensor, state has a {type(current).__name__}")
        return
    if isinstance(current, torch.Tensor):
        if saved is not None:
            problems.append(f"{where}: state has a tensor, saved a {type(saved).__name__}")
        return
    if isinstance(saved, Mapping) and isinstance(current, Mapping):
        if strict and set(saved) != set(current):
            missing, extra = sorted(map(str, current.keys() - saved.keys())), sorted(map(str, saved.keys() - current.keys()))
            problems.append(f"{where}: keys missing from the checkpoint {missing[:3]}, not in the state {extra[:3]}")
        for k in saved.keys() & current.keys():
            _fit(saved[k], current[k], specs, f"{where}.{k}", problems, False)
    elif isinstance(saved, (list, tuple)) and isinstance(current, (list, tuple)):
        for i, (a, b) in enumerate(zip(saved, current)):
            _fit(a, b, specs, f"{where}[{i}]", problems, False)


def _read_data(path: Path, manifest: fmt.Manifest, pool: Executor, tick: Callable[[], None] | None) -> list[torch.Tensor]:
    specs = list(manifest.tensors)
    tensors = [torch.empty(s.shape, dtype=fmt.dtype_from_name(s.dtype)) for s in specs]
    views = [fmt.byte_view(t) for t in tensors]
    cancel = threading.Event()
    futures: dict[str, Future[int]] = {}
    for name in fmt.data_file_names(manifest.files):
        lo, hi = manifest.files[name].range or (0, 0)
        futures[name] = pool.submit(fmt.read_range_into, path / name, lo, hi, specs, views, tick, cancel)
    first: BaseException | None = None
    try:
        for name, fut in futures.items():
            try:
                crc = fut.result()
            except BaseException as err:  # noqa: BLE001 - re-raised below, after every reader stopped
                first = first or err
                cancel.set()
                continue
            if first is None and crc != manifest.files[name].crc32:
                first = fmt.CorruptCheckpoint(f"{name}: checksum mismatch")
                cancel.set()
    finally:
        cancel.set()
        wait(list(futures.values()))  # join every reader before the buffers can go
    if first is not None:
        if isinstance(first, OSError):
            raise fmt.CorruptCheckpoint(f"read error: {first}") from first
        raise first
    return tensors
