"""What one standby interpreter (resctl.launch.standby) costs while it waits: the seconds until its imports are done,
their CPU, its memory (RSS; PSS: its share of pages shared with the workers, libtorch's mapped files), and whether
it holds GPU memory (nvidia-smi's compute apps, where there is one).

    python bench/standby_cost.py [--late] [--repeats 3]

Prints one JSON object: medians over the repeats, and each repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from resctl.launch import preload, standby


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _kib(pid: int, path: str, key: str) -> int:
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return -1


def _gpu_mib(pid: int) -> int | None:
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return sum(int(m) for p, m in (line.split(", ") for line in out.splitlines() if ", " in line) if int(p) == pid)


def one(imports: tuple[str, ...]) -> dict[str, float | int | None]:
    args = [sys.executable, "-u", "-m", "resctl.shim"]
    t0 = time.monotonic()
    ready = standby.start(args, dict(os.environ), imports)
    assert ready is not None
    pid, last, still = ready.process.pid, -1.0, 0
    while still < 5:  # done importing: no CPU used for 0.5 s (it then waits on its pipe)
        time.sleep(0.1)
        now = _cpu_seconds(pid)
        still = still + 1 if now == last else 0
        last = now
    done = time.monotonic() - t0 - 0.5
    row = {"ready_s": round(done, 3), "cpu_s": round(last, 3), "rss_mib": _kib(pid, "status", "VmRSS") // 1024,
           "pss_mib": _kib(pid, "smaps_rollup", "Pss") // 1024,
           "anon_mib": _kib(pid, "smaps_rollup", "Pss_Anon") // 1024, "gpu_mib": _gpu_mib(pid)}
    ready.discard()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--late", action="store_true", help="also the late modules (torch._dynamo, FSDP)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    imports = preload.PRELOAD + (preload.LATE_PRELOAD if args.late else ())
    rows = [one(imports) for _ in range(args.repeats)]
    medians = {k: statistics.median(r[k] for r in rows) if rows[0][k] is not None else None for k in rows[0]}
    print(json.dumps({"imports": list(imports), "median": medians, "rows": rows}))


if __name__ == "__main__":
    main()
