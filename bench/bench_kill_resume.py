"""kill -9 of one worker -> first training step after the resume, torchrun vs resctl, side by side.

The same unmodified script (bench/scripts/ddp_snapshot.py, a DDP-tutorial-style script with its own
torch.save snapshot, or bench/scripts/fsdp2_dcp.py, FSDP2 with its own DCP snapshot) runs under
`torchrun` and under `resctl run` (default profile: the AWS values, monitor interval 5 s), the
launchers alternating round by round. In each fault round the benchmark waits until the script has
printed a step past a snapshot, SIGKILLs the worker of `--kill-rank` (its PID from the script's own
`PID` line), and measures from the kill to the first `STEP` line after the resume on *every* rank
(the slowest rank). Clean rounds time a fault-free run from start to exit. Both are measured from
outside the job, from the script's output, the same way for both launchers.

    python bench/bench_kill_resume.py --script ddp --nproc 2 --device cpu --faults 5 --clean 3
    python bench/bench_kill_resume.py --script fsdp2 --nproc 1 --device cuda --faults 5 --clean 3

Another NVRx version beside the installed one: a launcher `resctl@LABEL` runs `resctl run` with
`--nvrx-path LABEL=DIRS` put first on PYTHONPATH (DIRS: where that NVRx and its dependencies are), e.g.
NVRx 0.7.0 from its wheel's sources next to the venv's 0.4.1, all alternating round by round:

    python bench/bench_kill_resume.py --device cpu --launchers torchrun,resctl,resctl@0.7 \
        --nvrx-path 0.7=/work/nvrx07/src:/work/nvrx07/deps

Prints one JSON document: per launcher the p50 and every sample.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = {"ddp": REPO / "bench" / "scripts" / "ddp_snapshot.py", "fsdp2": REPO / "bench" / "scripts" / "fsdp2_dcp.py"}


class Job:
    """A launcher running the script; its output lines are collected with their arrival time."""

    def __init__(self, argv: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.t0 = time.time()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []
        self.arrival: list[float] = []  # time.time() each line arrived
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.cond:
                for part in GLUED.split(line.rstrip("\n")):
                    self.arrival.append(time.time())
                    self.lines.append(part)
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pred: Any, timeout: float, start: int = 0) -> tuple[int, str]:
        deadline = time.monotonic() + timeout
        with self.cond:
            i = start
            while True:
                while i < len(self.lines):
                    if pred(self.lines[i]):
                        return i, self.lines[i]
                    i += 1
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and i >= len(self.lines)):
                    tail = [line for line in self.lines[start:] if not STEP.search(line)][-40:]
                    raise TimeoutError(f"no matching line (exit {self.proc.poll()}, waited {timeout - left:.1f}s); last lines (other than STEP):\n" + "\n".join(tail))
                self.cond.wait(min(left, 0.5))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


#: resctl's launcher modifiers (`resctl[@LABEL][:MOD...]`): the profile keys each sets
MODIFIERS = {"exec": "launch.worker_start=exec", "standby": "launch.standby=on", "nostandby": "launch.standby=off"}


def argv_for(launcher: str, nproc: int, script: Path, script_args: list[str], resctl_args: list[str]) -> list[str]:
    """`resctl[@LABEL][:exec][:standby|:nostandby]`: `:exec` starts resctl's workers as fresh interpreters
    (`launch.worker_start`); `:standby`/`:nostandby` turn exec'd workers' standby interpreters on/off (`launch.standby`;
    without either: auto)."""
    common = ["--nproc-per-node", str(nproc), "--max-restarts", "3"]
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", *common, str(script), *script_args]
    start = [a for mod in launcher.split(":")[1:] for a in ("--set", MODIFIERS[mod])]
    return [sys.executable, "-m", "resctl", "run", *common, *start, *resctl_args, str(script), *script_args]


def env_for(launcher: str, env: dict[str, str], nvrx_paths: dict[str, str]) -> dict[str, str]:
    """`resctl@LABEL`: the environment with that NVRx's directories first on PYTHONPATH."""
    _, _, label = launcher.split(":")[0].partition("@")
    if not label:
        return env
    if label not in nvrx_paths:
        raise SystemExit(f"--launchers names {launcher} but no --nvrx-path {label}=DIRS says where that NVRx is")
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (nvrx_paths[label], env.get("PYTHONPATH", "")) if p)}


STEP = re.compile(r"STEP (\d+) (\d+) ([\d.]+)$")
#: Workers' stdout is write-through under both launchers (print writes the text and the newline apart), so two
#: ranks' lines can arrive glued ("STEP 1 15 t1STEP 0 15 t0"): split them before each marker.
GLUED = re.compile(r"(?=STEP \d+ \d+ )|(?=PID \d+ \d+)")
PID = re.compile(r"PID (\d+) (\d+)\b")


def steps_of(line: str) -> tuple[int, int, float] | None:
    m = STEP.search(line)
    return (int(m[1]), int(m[2]), float(m[3])) if m else None


def fault_round(launcher: str, args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> float:
    script_args = [*args.script_args, "--steps", str(args.steps), "--device", args.device]
    job = Job(argv_for(launcher, args.nproc, SCRIPTS[args.script], script_args, args.resctl_args), tmp,
              env_for(launcher, env, args.nvrx_paths))
    try:
        pid_line = {}
        i, _ = job.wait_line(lambda l: (s := steps_of(l)) is not None and s[0] == args.kill_rank and s[1] >= args.kill_after,
                             args.timeout)
        for line in job.lines[:i]:
            if m := PID.search(line):
                pid_line[int(m[1])] = int(m[2])
        os.kill(pid_line[args.kill_rank], signal.SIGKILL)
        t_kill = time.time()
        mark, _ = job.wait_line(lambda l: "Resuming" in l, args.timeout, len(job.lines))
        first_after: dict[int, float] = {}
        while len(first_after) < args.nproc:
            mark, line = job.wait_line(lambda l: (s := steps_of(l)) is not None and s[0] not in first_after,
                                       args.timeout, mark + 1)
            rank_step = steps_of(line)
            assert rank_step is not None
            first_after[rank_step[0]] = rank_step[2]
        return max(first_after.values()) - t_kill
    finally:
        job.stop()


def clean_round(launcher: str, args: argparse.Namespace, tmp: Path, env: dict[str, str]) -> float:
    script_args = [*args.script_args, "--steps", str(args.steps), "--device", args.device]
    job = Job(argv_for(launcher, args.nproc, SCRIPTS[args.script], script_args, args.resctl_args), tmp,
              env_for(launcher, env, args.nvrx_paths))
    code = job.proc.wait(timeout=args.timeout)
    wall = time.time() - job.t0
    if code != 0:
        raise RuntimeError(f"{launcher} clean run exited {code}:\n" + "\n".join(job.lines[-20:]))
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--script", choices=sorted(SCRIPTS), default="ddp")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--faults", type=int, default=5, help="fault rounds per launcher")
    ap.add_argument("--clean", type=int, default=3, help="fault-free rounds per launcher")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-after", type=int, default=15, help="kill once this step is printed (after a snapshot)")
    ap.add_argument("--kill-rank", type=int, default=-1, help="default: the last rank")
    ap.add_argument("--launchers", default="torchrun,resctl", help="torchrun, resctl, resctl@LABEL (see --nvrx-path), any resctl with :exec (exec'd workers), :standby / :nostandby (their standby interpreters)")
    ap.add_argument("--nvrx-path", action="append", default=[], metavar="LABEL=DIRS",
                    help="where the NVRx of `resctl@LABEL` is: directories put first on PYTHONPATH (':'-separated)")
    ap.add_argument("--resctl-args", default="", help="extra `resctl run` arguments, space separated")
    ap.add_argument("--script-args", default="", help="extra script arguments, space separated")
    ap.add_argument("--timeout", type=float, default=120, help="seconds a round may take")
    args = ap.parse_args()
    args.kill_rank = args.nproc - 1 if args.kill_rank < 0 else args.kill_rank
    args.resctl_args = args.resctl_args.split()
    args.script_args = args.script_args.split()
    args.nvrx_paths = dict(item.split("=", 1) for item in args.nvrx_path)
    launchers = args.launchers.split(",")
    # Buffered stdout (the scripts print each line with flush=True): one write per line. Unbuffered,
    # print() writes the text and the newline apart and two ranks' lines could glue together (a PID
    # line lost, seen once).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    result: dict[str, Any] = {"script": args.script, "nproc": args.nproc, "device": args.device,
                              "kill_to_first_step": {l: [] for l in launchers}, "clean_wall": {l: [] for l in launchers}}
    for kind, rounds, fn in (("kill_to_first_step", args.faults, fault_round), ("clean_wall", args.clean, clean_round)):
        for _ in range(rounds):
            for launcher in launchers:  # alternating, so drift on a shared machine hits both alike
                with tempfile.TemporaryDirectory(prefix=f"kill-{launcher}-") as tmp:
                    try:
                        result[kind][launcher].append(round(fn(launcher, args, Path(tmp), env), 3))
                        print(f"{kind} {launcher} {result[kind][launcher][-1]}", file=sys.stderr, flush=True)
                    except Exception:  # noqa: BLE001 - a failed round is reported, the others still count
                        result.setdefault("errors", []).append(f"{kind} {launcher}: {traceback.format_exc()}"[-3000:])
    result["p50"] = {kind: {l: (statistics.median(v) if v else None) for l, v in result[kind].items()}
                     for kind in ("kill_to_first_step", "clean_wall")}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
