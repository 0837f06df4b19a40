"""Recovery of each framework's own checkpointing from a SIGKILL: torchrun against resctl (forked and exec'd workers).

Runs tests/compat/scripts/fw_{lightning,fabric,accelerate,hf_trainer}.py (tiny models, 2 CPU ranks, gloo,
checkpoints every 10 of 30 steps) with rank 1 SIGKILLed at step 15 on the first attempt, under
`torchrun --max-restarts R`, `resctl run --max-restarts R` (fork) and the same with exec'd workers; the
launchers alternate, their order rotating from run to run. Per run: exit code, whether both ranks resumed
from step 10, the final checksum (and whether it equals the uninterrupted torchrun run's), and the time from
the kill to the first step of the next attempt (the scripts write both instants to files). A run that does
not end within --timeout seconds is a hang.

Usage: python bench/bench_frameworks.py [--runs 2] [--timeout 150] [--frameworks fw_lightning,...]
           [--launchers torchrun,fork,exec] [--max-restarts 1]
Prints one JSON object: per framework and launcher, every run and the median recovery.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "tests" / "compat" / "scripts"
BIN = Path(sys.executable).parent
FRAMEWORKS = ("fw_lightning", "fw_fabric", "fw_accelerate", "fw_hf_trainer")
LAUNCHERS = ("torchrun", "fork", "exec")
KILL_AT = "15"
CHECKSUM = re.compile(r"FACT rank=\d+ steps=\d+ checksum=(\S+)")
RESUMED = re.compile(r"FACT rank=(\d) attempt=[1-9] start_step=(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(launcher: str, script: Path, out: Path, kill: bool, restarts: int) -> list[str]:
    if launcher == "torchrun":
        argv = [str(BIN / "torchrun"), "--master-port", str(free_port())]
    else:
        argv = [str(BIN / "resctl"), "run", "--run-dir", str(out / "run")]
        if launcher == "exec":
            argv += ["--set", "launch.worker_start=exec"]
    return [*argv, "--nproc-per-node", "2", "--max-restarts", str(restarts), str(script), str(out),
            *([KILL_AT] if kill else [])]


def launch(launcher: str, framework: str, kill: bool, timeout: float, restarts: int = 1) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"bench-fw-{framework}-{launcher}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RESCTL_", "MASTER_", "TORCHELASTIC_"))}
    t0 = time.monotonic()
    proc = subprocess.Popen(command(launcher, SCRIPTS / f"{framework}.py", out, kill, restarts), cwd=SCRIPTS, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:  # a hang: torchrun's workers lead sessions of their own, so kill the tree
        tree = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for child in tree:
            try:
                child.kill()
            except psutil.Error:
                pass
        text, _ = proc.communicate()
        code = None
    wall = time.monotonic() - t0
    row: dict[str, Any] = {"code": code, "hang": code is None, "wall_s": round(wall, 2),
                           "checksums": sorted(set(CHECKSUM.findall(text)))}
    if kill:
        row["resumed_from"] = sorted({int(s) for _, s in RESUMED.findall(text)})
        try:
            killed, resumed = (float((out / f"{w}.t").read_text()) for w in ("killed", "resumed"))
            row["recovery_s"] = round(resumed - killed, 3)
        except (OSError, ValueError):
            row["recovery_s"] = None
        if code != 0:  # what went wrong: the errors the workers printed (gloo's, a traceback's last line)
            row["errors"] = list(dict.fromkeys(line.strip()[:160] for line in text.splitlines()
                                               if re.search(r"Error\b|refused|timed out", line)))[-4:]
    shutil.rmtree(out, ignore_errors=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=150.0)
    ap.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    ap.add_argument("--launchers", default=",".join(LAUNCHERS))
    ap.add_argument("--max-restarts", type=int, default=1)
    args = ap.parse_args()
    launchers = tuple(args.launchers.split(","))
    results: dict[str, Any] = {}
    for framework in args.frameworks.split(","):
        reference = launch("torchrun", framework, kill=False, timeout=args.timeout)["checksums"]
        runs: dict[str, list[dict[str, Any]]] = {la: [] for la in launchers}
        for i in range(args.runs):
            k = i % len(launchers)
            for launcher in launchers[k:] + launchers[:k]:
                row = launch(launcher, framework, kill=True, timeout=args.timeout, restarts=args.max_restarts)
                row["same_weights_as_uninterrupted"] = bool(row["checksums"]) and row["checksums"] == reference
                runs[launcher].append(row)
                print(framework, launcher, json.dumps(row), file=sys.stderr, flush=True)
        summary = {}
        for launcher, rows in runs.items():
            ok = [r for r in rows if r["code"] == 0 and r["resumed_from"] == [10]]
            times = [r["recovery_s"] for r in ok if r["recovery_s"] is not None]
            summary[launcher] = {"resumed_ok": f"{len(ok)}/{len(rows)}", "hangs": sum(r["hang"] for r in rows),
                                 "recovery_s_median": round(statistics.median(times), 2) if times else None,
                                 "recovery_s": times,
                                 "same_weights": sum(r["same_weights_as_uninterrupted"] for r in ok)}
        results[framework] = {"uninterrupted_checksum": reference, "summary": summary, "runs": runs}
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg()[1],
                      "runs": args.runs, "max_restarts": args.max_restarts, "results": results}, indent=1))


if __name__ == "__main__":
    main()
