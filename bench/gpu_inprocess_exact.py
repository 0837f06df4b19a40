"""Is an in-process restart exact? FSDP2 with its own DCP snapshot (bench/scripts/fsdp2_dcp.py).

Runs the unmodified script fault-free under torchrun (the reference) and under `resctl run` with an
`exception` drill at step 5, before its first snapshot, so the restarted iteration builds and
initialises the model again: in-job (in-process off), in-process with resctl's fresh-state restore,
and in-process with the restore switched off (`inprocess.fresh_state = false`, a diagnostic). Each
final model + optimizer state is compared bitwise with the reference. Prints one JSON document.

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python bench/gpu_inprocess_exact.py --nproc 1 --device cuda
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.integration.test_recovery import IN_PROCESS  # noqa: E402

SCRIPT = REPO / "bench" / "scripts" / "fsdp2_dcp.py"


def equal(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return bool(a == b)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    import torch

    base_env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    base_env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    base_env.setdefault("OMP_NUM_THREADS", "1")  # what torchrun gives its workers
    script = [str(SCRIPT), "--steps", str(args.steps), "--device", args.device, "--width", "256"]
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="exact-") as tmp_s:
        tmp = Path(tmp_s)

        def go(name: str, launcher: list[str], env: dict[str, str]) -> None:
            work = tmp / name
            work.mkdir()
            t = time.monotonic()
            proc = subprocess.run([*launcher, *script, "--out", str(work / "final.pt")], cwd=work,
                                  env={**base_env, **env}, capture_output=True, text=True, timeout=400)
            runs[name] = {"exit": proc.returncode, "wall": round(time.monotonic() - t, 2),
                          "restarts": proc.stdout.count("PID 0 ") - 1}
            if proc.returncode != 0:
                runs[name]["tail"] = (proc.stdout + proc.stderr)[-3000:]

        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.nproc)]
        resctl = [sys.executable, "-m", "resctl", "run", "--nproc-per-node", str(args.nproc), "--max-restarts", "3"]
        inproc = [x for item in IN_PROCESS for x in ("--set", item)]
        go("torchrun-fault-free", torchrun, {})
        drill = {"RESCTL_FAULTS": "exception@5:0"}
        go("resctl-fault-free", resctl, {})
        go("resctl-injob", resctl, drill)
        go("resctl-inprocess", [*resctl, *inproc], drill)
        go("resctl-inprocess-no-fresh-state", [*resctl, *inproc, "--set", "inprocess.fresh_state=false"], drill)
        ref = torch.load(tmp / "torchrun-fault-free" / "final.pt", weights_only=True)
        for name, run in runs.items():
            out = tmp / name / "final.pt"
            run["bitwise_equal_to_torchrun"] = out.exists() and equal(torch.load(out, weights_only=True), ref)
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
