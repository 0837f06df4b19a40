"""`resctl report --json` and a metrics scrape on a long synthetic run.

    python bench/bench_report.py                       # 200,000 steps x 2 ranks, a checkpoint every 100
    python bench/bench_report.py --steps 20000 --repeats 3

Writes the events a 2-rank job would (`start`, a `step` per rank per step, `ckpt_stall` on both
ranks and `ckpt_persist` on rank 0 every `--every` steps, a SIGKILL of rank 1 in the middle and
the launcher restart that resumes from the last checkpoint), then measures:

- `resctl report --json` as a user runs it (a fresh interpreter), wall time and peak RSS of the
  child (getrusage), median of `--repeats`;
- the metrics endpoint (`resctl.telemetry.metrics.serve`) on the same directory: how long the
  background thread takes to read the whole backlog, then the wall time of an HTTP scrape, median
  of 20; and, in a fresh process, the time and peak RSS of reading the whole backlog at once.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from resctl.telemetry import metrics  # noqa: E402

T0 = 1_800_000_000.0


def write_run(run: Path, steps: int, every: int, step_s: float = 0.094) -> int:
    """The events files; returns their total size in bytes."""
    run.mkdir(parents=True, exist_ok=True)
    kill_at = steps // 2 + every // 2
    resume = (kill_at // every) * every
    for rank in (0, 1):
        lines = []

        def emit(t: float, kind: str, cycle: int, **fields: object) -> None:
            lines.append(json.dumps({"t": round(t, 6), "kind": kind, "rank": rank, "cycle": cycle, "iteration": 0,
                                     **fields}, separators=(",", ":")))

        t = T0 + rank * 0.01
        for cycle, first, last in ((0, 1, kill_at), (1, resume + 1, steps)):
            emit(t, "start", cycle, pid=1000 + rank, host="h", world_size=2, script="train.py")
            if cycle:
                emit(t, "restart", cycle, layer="launcher")
                t += 1.0
                emit(t, "resume", cycle, step=resume, load_seconds=0.5)
            for step in range(first, last + 1):
                t += step_s
                emit(t, "step", cycle, step=step, duration=step_s)
                if step % every == 0:
                    stall = 0.004 if rank == 0 else 0.0
                    t += stall
                    emit(t, "ckpt_stall", cycle, step=step, seconds=stall, waited=0.0)
                    if rank == 0:
                        emit(t + 2.0, "ckpt_persist", cycle, step=step, seconds=2.0, bytes=6_440_000_000)
            if cycle == 0 and rank == 1:
                emit(t, "fault", cycle, cause="sigkill", injected=True, step=last, error="injected sigkill")
            elif cycle == 0:
                emit(t + 0.5, "fault", cycle, cause="sigterm", step=last, error="SIGTERM received")
            t += 2.5
        emit(t, "end", 1, status="ok", step=steps)
        lines.sort(key=lambda line: json.loads(line)["t"])
        (run / f"events-rank{rank}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sum(p.stat().st_size for p in run.glob("events-rank*.jsonl"))


def report_once(run: Path, source: Path = REPO, timeout: float | None = None) -> tuple[float, float, dict[str, object]]:
    """(wall s, peak RSS MB of the child, the JSON) of one `resctl report --json` of the resctl in
    `source` (this checkout, or an older revision extracted by `--baseline`)."""
    code = ("import resource, subprocess, sys, time, json; t = time.perf_counter(); "
            "p = subprocess.run([sys.executable, '-m', 'resctl', 'report', sys.argv[1], '--json'], capture_output=True); "
            "w = time.perf_counter() - t; r = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
            "sys.stderr.write(p.stderr.decode()); sys.stdout.write(json.dumps([w, r / 1024, p.returncode]) + '\\n'); "
            "sys.stdout.write(p.stdout.decode())")
    env = {**os.environ, "PYTHONPATH": str(source), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, cwd=source,
                          env=env, timeout=timeout)
    head, _, body = proc.stdout.partition("\n")
    wall, rss, rc = json.loads(head)
    if rc != 0:
        raise SystemExit(f"report failed ({rc}): {proc.stderr[-2000:]}")
    return wall, rss, json.loads(body)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ingest_rss(run: Path) -> tuple[float, float]:
    """(seconds, peak RSS MB) of a fresh process that reads the whole run into a RunCollector (VmHWM:
    ru_maxrss would include this big process's RSS from before the exec)."""
    code = ("import resource, sys, time; from pathlib import Path; from resctl.telemetry.metrics import RunCollector; "
            "t = time.perf_counter(); c = RunCollector(Path(sys.argv[1])); c.update(); "
            "hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]; "
            "print(time.perf_counter() - t, int(hwm) / 1024, c.steps)")
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, cwd=REPO, check=True)
    seconds, rss, _ = out.stdout.split()
    return float(seconds), float(rss)


def scrape_bench(run: Path, scrapes: int = 20) -> dict[str, float]:
    """Serve the run; once the update thread has read it all, time HTTP scrapes."""
    port = free_port()
    server = metrics.serve(run, port, addr="127.0.0.1", every=0.2)
    collector = server.resctl_collector
    total = sum(p.stat().st_size for p in run.glob("events-rank*.jsonl"))
    while sum(collector.tail._offsets.values()) < total:
        time.sleep(0.05)
    collector.update()  # the last batch's values are published
    times = []
    body = b""
    for _ in range(scrapes):
        t = time.perf_counter()
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        times.append(time.perf_counter() - t)
    collector.stop()
    server.shutdown()
    steps = [line for line in body.decode().splitlines() if line.startswith("resctl_steps_total")]
    ingest_s, rss = ingest_rss(run)
    return {"scrape_median_ms": 1000 * statistics.median(times), "scrape_max_ms": 1000 * max(times),
            "steps_metric": steps[0], "ingest_whole_run_s": ingest_s, "ingest_peak_rss_mb": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write the run (default: a temp dir, removed)")
    ap.add_argument("--baseline", default=None, metavar="REV",
                    help="also time `report --json` of this git revision (once, side by side), e.g. 15ad491")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        run = Path(tmp) / "run"
        t = time.perf_counter()
        size = write_run(run, args.steps, args.every)
        print(f"wrote {size / 2**20:.1f} MB of events in {time.perf_counter() - t:.1f} s", flush=True)
        walls, rsss = [], []
        doc: dict[str, object] = {}
        for _ in range(args.repeats):
            wall, rss, doc = report_once(run)
            walls.append(wall)
            rsss.append(rss)
            print(f"report --json: {wall:.2f} s, peak RSS {rss:.0f} MB", flush=True)
        baseline = None
        if args.baseline:
            base = Path(tmp) / "baseline"
            base.mkdir()
            archive = subprocess.run(["git", "archive", args.baseline, "resctl"], cwd=REPO, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
            try:
                b_wall, b_rss, _ = report_once(run, base, timeout=600)
                baseline = {"rev": args.baseline, "report_wall_s": round(b_wall, 3), "peak_rss_mb": round(b_rss, 1)}
            except subprocess.TimeoutExpired:
                baseline = {"rev": args.baseline, "report_wall_s": "> 600"}
            print(f"baseline {baseline}", flush=True)
        scrape = scrape_bench(run)
        result = {"steps": args.steps, "every": args.every, "events_mb": round(size / 2**20, 1),
                  "report_wall_s_median": round(statistics.median(walls), 3), "report_wall_s": [round(w, 3) for w in walls],
                  "report_peak_rss_mb_max": round(max(rsss), 1),
                  "report": {k: doc[k] for k in ("final_step", "kept_steps", "steps_run", "checkpoints")},
                  "baseline": baseline,
                  "metrics": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in scrape.items()},
                  "cpus": os.cpu_count(), "python": sys.version.split()[0]}
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    main()
