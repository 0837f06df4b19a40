"""Is `resctl doctor`'s storage number the disk's number? And its --deep copy number torch's?

storage (default): the doctor's storage test (`resctl.doctor.storage.measure`) against dd on the
same directory with the same number of parallel streams and bytes, alternating, median of
--repeats: its O_DIRECT write against `dd oflag=direct conv=fsync` (and fio --direct=1 when
installed), the criterion: within 15 %; its buffered write+fsync (the checkpoint path) against
`dd conv=fsync`; its read against `dd iflag=direct`.

    python bench/bench_storage.py --dir /fsx/bench --mb 2048 --writers 1,4 --repeats 3

copy: a plain torch pinned host->device / device->host copy (``pinned.to("cuda")`` timed with
perf_counter and synchronize) against the doctor's --deep copy (`resctl.doctor.deep.copy_gbps`),
alternating on GPU 0. The doctor passes when it is within 10 %.

    python bench/bench_storage.py copy --repeats 5
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from resctl.doctor.storage import find_mount, measure


def dd_write(directory: Path, total: int, streams: int, read: bool, direct: bool = True) -> tuple[float, float]:
    """(write GB/s, read GB/s) of `streams` parallel dd processes (write with conv=fsync, O_DIRECT
    when `direct`; read with iflag=direct), `total` bytes in all."""
    bs = 8 << 20
    count = max(1, total // streams // bs)
    files = [directory / f"dd{i}.bin" for i in range(streams)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(["dd", "if=/dev/zero", f"of={f}", f"bs={bs}", f"count={count}", "conv=fsync",
                               *(["oflag=direct"] if direct else [])], stderr=subprocess.DEVNULL) for f in files]
    if any(p.wait() for p in procs):
        raise RuntimeError("dd write failed")
    w = count * bs * streams / (time.perf_counter() - t0) / 1e9
    r = 0.0
    if read:
        t0 = time.perf_counter()
        procs = [subprocess.Popen(["dd", f"if={f}", "of=/dev/null", f"bs={bs}", "iflag=direct"],
                                  stderr=subprocess.DEVNULL) for f in files]
        if any(p.wait() for p in procs):
            raise RuntimeError("dd read failed")
        r = count * bs * streams / (time.perf_counter() - t0) / 1e9
    for f in files:
        f.unlink()
    return w, r


def fio_write(directory: Path, total: int, streams: int) -> float:
    out = subprocess.run(["fio", "--name=w", f"--directory={directory}", "--rw=write", "--bs=8m",
                          f"--size={total // streams}", f"--numjobs={streams}", "--direct=1", "--end_fsync=1",
                          "--group_reporting", "--output-format=json"], capture_output=True, text=True, check=True)
    job = json.loads(out.stdout)["jobs"][0]["write"]
    for f in directory.glob("w.*"):
        f.unlink()
    return job["bw_bytes"] / 1e9


def storage(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    mount = find_mount(Path("/proc/mounts").read_text(), str(base.resolve()))
    fio = shutil.which("fio") is not None
    total = args.mb * 1_000_000
    rows = []
    for streams in [int(w) for w in args.writers.split(",")]:
        runs: dict[str, list[float]] = {"doctor_direct": [], "dd_direct": [], "fio_direct": [],
                                        "doctor_buffered": [], "dd_buffered": [], "doctor_read": [], "dd_read": []}
        for rep in range(args.repeats):
            work = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=base))
            try:
                def doctor() -> None:
                    t = measure(work, total, streams)
                    runs["doctor_buffered"].append(t.write_gbps)
                    runs["doctor_read"].append(t.read_gbps)
                    runs["doctor_direct"].append(t.direct_gbps or 0.0)

                def tools() -> None:
                    w, r = dd_write(work, total, streams, read=True)
                    runs["dd_direct"].append(w)
                    runs["dd_read"].append(r)
                    runs["dd_buffered"].append(dd_write(work, total, streams, read=False, direct=False)[0])
                    if fio:
                        runs["fio_direct"].append(fio_write(work, total, streams))

                # alternate who goes first: on a VM disk the host may still be flushing the previous
                # writer's data, which would always handicap the second
                for step in ((doctor, tools) if rep % 2 == 0 else (tools, doctor)):
                    step()
            finally:
                shutil.rmtree(work, ignore_errors=True)
        med = {k: statistics.median(v) for k, v in runs.items() if v}
        ratio = med["doctor_direct"] / med["dd_direct"]
        buffered = med["doctor_buffered"] / med["dd_buffered"]
        rows.append({"writers": streams, **{k: round(v, 3) for k, v in med.items()},
                     "all": {k: [round(x, 3) for x in v] for k, v in runs.items() if v},
                     "direct_ratio_doctor_dd": round(ratio, 3), "within_15pct": abs(ratio - 1) <= 0.15,
                     "buffered_ratio_doctor_dd": round(buffered, 3),
                     "direct_ratio_doctor_fio": round(med["doctor_direct"] / med["fio_direct"], 3) if fio else None})
        print(f"writers={streams}: O_DIRECT write doctor {med['doctor_direct']:.3f} vs dd oflag=direct "
              f"{med['dd_direct']:.3f} GB/s (ratio {ratio:.3f})" + (f", fio --direct=1 {med['fio_direct']:.3f} (ratio {med['doctor_direct'] / med['fio_direct']:.3f})"
                 if fio else "")
              + f"; buffered+fsync doctor {med['doctor_buffered']:.3f} vs dd conv=fsync {med['dd_buffered']:.3f} "
              f"(ratio {buffered:.3f}); read doctor {med['doctor_read']:.3f} vs dd iflag=direct "
              f"{med['dd_read']:.3f} GB/s", flush=True)
    return {"dir": str(base), "mount": mount.__dict__ if mount else None, "mb": args.mb, "repeats": args.repeats,
            "fio": fio, "rows": rows}


def copy(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from resctl.doctor import deep

    n = deep.COPY_BYTES
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda:0")

    def plain() -> tuple[float, float]:
        times_h2d, times_d2h = [], []
        for _ in range(deep.REPEATS):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            x = host.to("cuda:0", non_blocking=True)
            torch.cuda.synchronize()
            times_h2d.append(time.perf_counter() - t0)
            del x
            t0 = time.perf_counter()
            host.copy_(dev, non_blocking=True)
            torch.cuda.synchronize()
            times_d2h.append(time.perf_counter() - t0)
        return n / statistics.median(times_h2d) / 1e9, n / statistics.median(times_d2h) / 1e9

    plain()  # warm-up: allocator, clocks
    ref: dict[str, list[float]] = {"torch_h2d": [], "torch_d2h": [], "doctor_h2d": [], "doctor_d2h": []}
    for _ in range(args.repeats):
        h, d = plain()
        ref["torch_h2d"].append(h)
        ref["torch_d2h"].append(d)
        h, d = deep.copy_gbps(torch, 0)
        ref["doctor_h2d"].append(h)
        ref["doctor_d2h"].append(d)
    med = {k: round(statistics.median(v), 2) for k, v in ref.items()}
    out = {"gpu": torch.cuda.get_device_name(0), "bytes": n, **med,
           "h2d_ratio": round(med["doctor_h2d"] / med["torch_h2d"], 3),
           "d2h_ratio": round(med["doctor_d2h"] / med["torch_d2h"], 3), "all": ref}
    print(f"{out['gpu']}: h2d torch {med['torch_h2d']} vs doctor {med['doctor_h2d']} GB/s (ratio {out['h2d_ratio']}); "
          f"d2h torch {med['torch_d2h']} vs doctor {med['doctor_d2h']} GB/s (ratio {out['d2h_ratio']})", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", choices=["storage", "copy"], default="storage")
    parser.add_argument("--dir", default=".", help="directory to test (storage)")
    parser.add_argument("--mb", type=int, default=1024, help="MB per measurement (storage)")
    parser.add_argument("--writers", default="1,4", help="parallel streams, comma-separated (storage)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    result = storage(args) if args.mode == "storage" else copy(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
