"""The deterministic recovery drill on GPUs with NCCL (issue 3, "On the GPU machine").

Runs examples/train_ckpt.py under `resctl run` on `--nproc` GPUs with the NCCL backend: once
fault-free, then with the five-fault schedule of tests/integration/test_recovery.py (exception,
SIGKILL, hang, a failed checkpoint write, and a second fault right after a restart) with in-process
restart off and on. Every faulty run must exit 0 with model and optimizer state bitwise equal to
the fault-free run. Prints one JSON document (exit code 1 when a run fails or differs).

    CUBLAS_WORKSPACE_CONFIG=:4096:8 python bench/gpu_recovery.py --nproc 1
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.integration.test_recovery import (  # noqa: E402
    FIVE_FAULTS,
    SECOND_FAULT_AFTER_RESTART,
    assert_bitwise_equal,
    job,
)


def run(tmp: Path, name: str, nproc: int, inprocess: bool, faults: str, width: int) -> dict:
    args = job(tmp, name, nproc, inprocess=inprocess, steps=30, step_time=0.03)
    args = [a for a in args]
    args += ["--width", str(width), "--device", "cuda", "--backend", "nccl"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    if faults:
        env["RESCTL_FAULTS"] = faults
    t = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "resctl", "run", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=400)
    out = {"name": name, "exit": proc.returncode, "wall_s": round(time.monotonic() - t, 1),
           "faults": faults, "inprocess": inprocess}
    if proc.returncode != 0:
        out["tail"] = (proc.stdout + proc.stderr)[-3000:]
    events = [json.loads(line) for p in (tmp / name).glob("events-rank*.jsonl") for line in p.read_text().splitlines()
              if line.strip()]
    out["cycles"] = max((e["cycle"] for e in events), default=0)
    out["inprocess_restarts"] = sum(e["kind"] == "restart" and e.get("layer") == "inprocess" for e in events)
    return out


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    schedule = FIVE_FAULTS + "," + SECOND_FAULT_AFTER_RESTART
    schedule = ",".join(item.rsplit(":", 1)[0] + f":{int(item.rsplit(':', 1)[1]) % args.nproc}"
                        for item in schedule.split(","))
    results = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="resctl-gpu-recovery-") as d:
        tmp = Path(d)
        ref = run(tmp, "ref", args.nproc, False, "", args.width)
        results.append(ref)
        for inprocess in (False, True):
            name = "faults-inprocess" if inprocess else "faults-injob"
            r = run(tmp, name, args.nproc, inprocess, schedule, args.width)
            if r["exit"] == 0 and ref["exit"] == 0:
                a = torch.load(tmp / "ref.pt", weights_only=True)
                b = torch.load(tmp / f"{name}.pt", weights_only=True)
                try:
                    assert_bitwise_equal(a, b)
                    r["bitwise_equal"] = True
                except AssertionError as err:
                    r["bitwise_equal"] = False
                    r["differs_at"] = str(err)
            ok = ok and r["exit"] == 0 and r.get("bitwise_equal", False)
            results.append(r)
    print(json.dumps({"gpu": torch.cuda.get_device_name(0), "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                      "torch": torch.__version__, "nproc": args.nproc, "schedule": schedule, "runs": results},
                     indent=2))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
