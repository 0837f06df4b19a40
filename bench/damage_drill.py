"""Damage drill (issue 11's measurement): steps 1 and 2 of a 24 MB state over 4 data files are
saved, step 2 is damaged in each of several ways, and each load runs in its own process.
Counts crashes (a signal or an abort), wrong loads (a step whose data is not what was saved at it)
and fallbacks to step 1.

    python bench/damage_drill.py --repeats 5            # this tree
    PYTHONPATH=/path/to/old/tree python bench/damage_drill.py  # another version of resctl
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

LOADER = textwrap.dedent(
    """
    import sys, torch, logging
    logging.disable(logging.CRITICAL)
    from resctl.checkpoint import Checkpointer
    state = {"a": None, "b": None, "info": None}
    step = Checkpointer(dir=sys.argv[1], rank=0, world_size=1).load(state)
    ok = step == 0 or (state["info"] == {"step": step} and bool((state["a"] == step).all()) and bool((state["b"] == step).all()))
    print(step, "ok" if ok else "WRONG")
    """
)


def save(root: Path) -> None:
    import torch

    from resctl.checkpoint import Checkpointer

    ck = Checkpointer(dir=root, rank=0, world_size=1, async_=False, writers=4, keep_last=5)
    for step in (1, 2):
        ck.save({"a": torch.full((4 << 20,), float(step)), "b": torch.full((1 << 20,), step, dtype=torch.int64),
                 "info": {"step": step}}, step)
    ck.close()


def damages(step2: Path) -> dict[str, list[tuple[str, int, bytes | None]]]:
    data = sorted(p.name for p in step2.glob("data-*.bin"))
    out: dict[str, list[tuple[str, int, bytes | None]]] = {}
    for name in data:
        out[f"flip {name}"] = [(name, 4096, None)]
        out[f"random bytes in {name}"] = [(name, 1 << 20, os.urandom(4096))]
    out["flip every data file"] = [(name, 777, None) for name in data]
    out["flip meta.pt"] = [("meta.pt", 40, None)]
    return out


def apply(step2: Path, edits: list[tuple[str, int, bytes | None]]) -> None:
    for name, offset, payload in edits:
        path = step2 / name
        raw = bytearray(path.read_bytes())
        if payload is None:
            raw[offset % len(raw)] ^= 0xFF
        else:
            raw[offset : offset + len(payload)] = payload
        path.write_bytes(bytes(raw))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="loads per kind of damage")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        save(base)
        kinds = damages(base / "step-000000002")
        counts = {"loads": 0, "crash": 0, "wrong": 0, "fell back to 1": 0, "loaded 2": 0, "none": 0}
        for kind, edits in kinds.items():
            for _ in range(args.repeats):
                root = Path(tmp) / "case"
                shutil.rmtree(root, ignore_errors=True)
                shutil.copytree(base, root)
                apply(root / "step-000000002", edits)
                done = subprocess.run([sys.executable, "-c", LOADER, str(root)], capture_output=True, text=True)
                counts["loads"] += 1
                if done.returncode != 0:
                    counts["crash"] += 1
                    print(f"{kind}: exit {done.returncode} {done.stderr.strip().splitlines()[-1:]}")
                    continue
                step, verdict = done.stdout.split()
                counts["wrong"] += verdict != "ok"
                counts[{"0": "none", "1": "fell back to 1", "2": "loaded 2"}[step]] += 1
        print(f"{len(kinds)} kinds of damage x {args.repeats}: {counts}")


if __name__ == "__main__":
    main()
