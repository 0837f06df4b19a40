"""Property: whatever is done to a checkpoint directory, `load` never crashes and never returns a
step whose data differs from what was saved at that step.

Hypothesis damages a copy of a directory holding steps 1-3 (several data files each): flipped or
overwritten bytes, truncated, extended or deleted files, manifest edits with a recomputed checksum
(a buggy tool, not bit rot), renamed or copied step directories, leftover temp directories. Each
damaged copy is loaded by a separate Python process (one process serves many examples to keep CI
fast; it is restarted after a failure), so a segfault or heap abort fails the example instead of
the test runner. The checks: the process survives; the result is a step whose digest is the one
saved at that step, 0, or a refusal (`CheckpointMismatch`) that only a manifest edit can cause;
and the load never falls back past the newest step directory nothing touched.

`RESCTL_CORRUPTION_EXAMPLES` sets the number of examples (default 200).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any, Iterator

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as hs  # noqa: E402

from resctl.checkpoint import format as fmt  # noqa: E402
from resctl.checkpoint.engine import Checkpointer  # noqa: E402

EXAMPLES = int(os.environ.get("RESCTL_CORRUPTION_EXAMPLES", "200"))
STEPS = (1, 2, 3)

COMMON = textwrap.dedent(
    """
    import hashlib, torch

    def make_state(step):
        torch.manual_seed(step)
        model = torch.nn.Linear(48, 40)
        return {
            "model": model,
            "w": torch.randn(6000) * step,
            "b": torch.arange(3000, dtype=torch.int64) * step,
            "h": (torch.randn(50, 30) * step).to(torch.bfloat16),
            "info": {"step": step, "name": f"step {step}"},
        }

    def blank():
        model = torch.nn.Linear(48, 40)
        return {"model": model, "w": None, "b": None, "h": None, "info": None}

    def digest(state):
        h = hashlib.sha256()
        for k, v in sorted(state["model"].state_dict().items()):
            h.update(k.encode()); h.update(v.contiguous().view(torch.uint8).numpy().tobytes())
        for name in ("w", "b", "h"):
            t = state[name]
            h.update(str((t.dtype, tuple(t.shape))).encode()); h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
        h.update(repr(state["info"]).encode())
        return h.hexdigest()
    """
)

WORKER = COMMON + textwrap.dedent(
    """
    import json, sys, logging, warnings
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    from resctl.checkpoint import Checkpointer, CheckpointMismatch
    for line in sys.stdin:
        root = line.strip()
        state = blank()
        try:
            step = Checkpointer(dir=root, rank=0, world_size=1, async_=False).load(state)
            out = {"step": step, "digest": digest(state) if step else None}
        except CheckpointMismatch as err:
            out = {"mismatch": str(err)[:300]}
        except BaseException as err:
            out = {"error": f"{type(err).__name__}: {err}"[:500]}
        print(json.dumps(out), flush=True)
    """
)

# Outcomes of every example, printed at the end (`pytest -s`): the numbers the issue asks for.
TALLY = {"examples": 0, "crashes": 0, "wrong_data": 0, "loaded_newest": 0, "fell_back": 0, "none": 0, "refused": 0}

namespace: dict[str, Any] = {}
exec(COMMON, namespace)  # the same state and digest functions as the worker


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, str]]:
    """Steps 1-3 saved, each over several data files (a small min size per file), and their digests."""
    root = tmp_path_factory.mktemp("corruption") / "base"
    real = fmt.split_ranges
    fmt.split_ranges = lambda total, writers, min_bytes=0: real(total, writers, 8 << 10)  # type: ignore[assignment]
    try:
        ck = Checkpointer(dir=root, rank=0, world_size=1, async_=False, keep_last=5, writers=4, exclusive=False)
        digests = {}
        for step in STEPS:
            state = namespace["make_state"](step)
            ck.save(state, step)
            digests[step] = namespace["digest"](state)
        ck.close()
    finally:
        fmt.split_ranges = real  # type: ignore[assignment]
    for step in STEPS:
        assert len(list((root / fmt.step_dir_name(step)).glob("data-*.bin"))) >= 3
    return root, digests


class Loader:
    """One worker process loading directories on request; restarted after it dies."""

    def __init__(self, script: Path) -> None:
        self.script = script
        self.proc: subprocess.Popen[str] | None = None

    def load(self, root: Path) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
            self.proc = subprocess.Popen([sys.executable, str(self.script)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{root}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            err = self.proc.stderr.read()[-2000:] if self.proc.stderr else ""
            self.proc = None
            return {"crash": code, "stderr": err}
        return dict(json.loads(line))

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def loader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loader]:
    script = tmp_path_factory.mktemp("worker") / "load_worker.py"
    script.write_text(WORKER)
    worker = Loader(script)
    yield worker
    worker.close()
    print(f"\ncorruption property: {TALLY}")
    assert TALLY["examples"] >= EXAMPLES and TALLY["crashes"] == 0 and TALLY["wrong_data"] == 0, TALLY


# --- damage ------------------------------------------------------------------------------------

step_st = hs.sampled_from(STEPS)
file_damage = hs.tuples(
    hs.sampled_from(["flip", "overwrite", "truncate", "extend", "delete"]),
    step_st,
    hs.integers(0, 10),  # which file (index into the sorted names, modulo)
    hs.floats(0, 1),  # where
    hs.binary(min_size=1, max_size=16),
)
manifest_edit = hs.tuples(
    hs.just("manifest"),
    step_st,
    hs.sampled_from(["step", "shape", "dtype", "offset", "range", "bytes", "crc", "kind", "drop_file", "stream", "meta_crc"]),
    hs.integers(-3, 1 << 20),
)
dir_damage = hs.tuples(
    hs.sampled_from(["rename", "copy", "temp"]),
    step_st,
    hs.integers(0, 9),
)
damage = hs.lists(hs.one_of(file_damage, manifest_edit, dir_damage), min_size=1, max_size=3)


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.is_file() and p.name != "reason.txt")


def _apply_file(d: Path, op: str, which: int, where: float, data: bytes) -> None:
    files = _files(d)
    if not files:
        return
    path = files[which % len(files)]
    raw = bytearray(path.read_bytes())
    pos = int(where * max(len(raw) - 1, 0))
    if op == "flip" and raw:
        raw[pos] ^= data[0] or 0xFF
    elif op == "overwrite":
        raw[pos : pos + len(data)] = data
    elif op == "truncate":
        raw = raw[:pos]
    elif op == "extend":
        raw += data
    elif op == "delete":
        path.unlink()
        return
    path.write_bytes(bytes(raw))


def _edit_manifest(d: Path, field: str, value: int) -> bool:
    """Rewrite one manifest field with a valid checksum; True when the edit may make the checkpoint
    intact but unfit for the state (a refusal is then a correct answer)."""
    path = d / fmt.MANIFEST
    try:
        raw = json.loads(path.read_text())
        body = raw["body"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    files = body.get("files", {})
    data = sorted(n for n in files if n.startswith("data-"))
    unfit = False
    if field == "step":
        body["step"] = value
    elif field in ("shape", "dtype", "offset") and body.get("tensors"):
        t = body["tensors"][value % len(body["tensors"])]
        if field == "shape":
            t[3] = [max(value, 0) % 7 + 1] + t[3][1:] if t[3] else [value]
        elif field == "dtype":
            t[2] = ["float32", "int64", "bfloat16", "uint8", "float64", "bogus"][value % 6]
        else:
            t[0] = value
        unfit = True
    elif field == "range" and data:
        files[data[value % len(data)]]["range"] = [value, value + 64]
    elif field == "bytes" and data:
        files[data[value % len(data)]]["bytes"] = value
    elif field == "crc" and data:
        files[data[value % len(data)]]["crc32"] = value & 0xFFFFFFFF
    elif field == "kind":
        body["kind"] = "dcp"
        unfit = True
    elif field == "drop_file" and data:
        del files[data[value % len(data)]]
    elif field == "stream":
        body["stream_bytes"] = value
    elif field == "meta_crc" and fmt.META in files:
        files[fmt.META]["crc32"] = value & 0xFFFFFFFF
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    path.write_text(json.dumps({"crc32": zlib.crc32(canonical), "body": body}))
    return unfit


def _apply(root: Path, plan: list[tuple[Any, ...]]) -> tuple[set[int], bool]:
    """Damage `root`; return the steps whose directories nothing touched, and whether a refusal is allowed."""
    intact = set(STEPS)
    unfit = False
    for item in plan:
        op, step = item[0], item[1]
        d = root / fmt.step_dir_name(step)
        if not d.exists():
            continue
        if op in ("copy", "temp"):  # the source stays as it was
            if op == "temp":  # a complete copy under a temp name: must never be loaded
                tmp = root / f".tmp-{fmt.step_dir_name(item[2] + 10)}-1-abcd"
                shutil.rmtree(tmp, ignore_errors=True)
                shutil.copytree(d, tmp)
                continue
            target = root / fmt.step_dir_name(item[2])
            if target != d:
                intact.discard(item[2])
                shutil.rmtree(target, ignore_errors=True)
                shutil.copytree(d, target)
            continue
        intact.discard(step)
        if op == "manifest":
            unfit |= _edit_manifest(d, item[2], item[3])
        elif op == "rename":
            target = root / fmt.step_dir_name(item[2])
            if target != d:
                intact.discard(item[2])
                shutil.rmtree(target, ignore_errors=True)
                os.rename(d, target)
        else:
            _apply_file(d, op, item[2], item[3], item[4])
    return intact, unfit


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=damage)
def test_damage_never_crashes_a_load_nor_returns_wrong_data(
    base: tuple[Path, dict[int, str]], loader: Loader, tmp_path: Path, plan: list[tuple[Any, ...]]
) -> None:
    src, digests = base
    root = tmp_path / f"case-{hashlib.sha1(repr(plan).encode()).hexdigest()[:12]}"
    shutil.copytree(src, root)
    try:
        intact, unfit_allowed = _apply(root, plan)
        out = loader.load(root)
        TALLY["examples"] += 1
        TALLY["crashes"] += "crash" in out
        assert "crash" not in out, f"loader died (exit {out.get('crash')}): {out.get('stderr')}"
        assert "error" not in out, out["error"]
        if "mismatch" in out:
            TALLY["refused"] += 1
            assert unfit_allowed, f"refused an intact-looking checkpoint without a manifest edit: {out['mismatch']}"
            return
        step = out["step"]
        wrong = step != 0 and out["digest"] != digests.get(step)
        TALLY["wrong_data"] += wrong
        TALLY["none" if step == 0 else "loaded_newest" if step == max(STEPS) else "fell_back"] += 1
        assert not wrong, f"step {step} loaded with data that was not saved at it"
        assert step >= max(intact, default=0), f"loaded {step}, but step {max(intact)} was untouched"
    finally:
        shutil.rmtree(root, ignore_errors=True)
