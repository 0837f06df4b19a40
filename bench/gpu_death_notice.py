"""How long a killed CUDA worker takes to be seen dead, and what a restarted one spends before its first step
(issue 43: the DDP tutorial's kill -> first epoch line). Run on a GPU machine; prints one JSON document.

A parent that imported torch (as resctl's launcher has) forks a child per round; the child makes its CUDA
context (`torch.cuda.set_device`), fills `--gib` GiB of GPU memory, makes a one-rank NCCL group and runs one
all-reduce, then a second group the same way (what of NCCL's start is once per process), reports each phase's seconds on a pipe, and waits. The parent SIGKILLs it and times, from the kill:
the child's end of a pipe reaching EOF (its files closed), its pidfd becoming readable (what a launcher's
monitor sees: the process is a zombie), and the reap. So: is "the launcher saw the worker die" the driver's
teardown of a CUDA context, and how much of a restarted worker's start is the context and NCCL.

    python bench/gpu_death_notice.py --rounds 4 --gib 2
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import statistics
import tempfile
import time

import torch


def child(write_fd: int, gib: float, store_dir: str, round_: int) -> None:
    import torch.distributed as dist

    cuda = torch.cuda.is_available()  # without: the same plumbing on the CPU (gloo), to try the bench itself
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t = {"forked": time.time()}
    if cuda:
        torch.cuda.set_device(0)
    torch.empty(1, device=device)
    sync()
    t["context"] = time.time()
    hold = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device).fill_(1)
    sync()
    t["memory"] = time.time()
    store = dist.FileStore(os.path.join(store_dir, f"store{round_}"), 1)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1,
                            device_id=device if cuda else None)
    x = torch.ones(1, device=device)
    dist.all_reduce(x)
    sync()
    t["nccl"] = time.time()
    dist.destroy_process_group()  # a second group in the same process: what of NCCL's start is once per process
    store = dist.FileStore(os.path.join(store_dir, f"store{round_}b"), 1)
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1,
                            device_id=device if cuda else None)
    dist.all_reduce(x)
    sync()
    t["nccl_again"] = time.time()
    os.write(write_fd, (json.dumps(t) + "\n").encode())
    del hold
    while True:
        time.sleep(60)


def one_round(gib: float, store_dir: str, round_: int) -> dict:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            child(w, gib, store_dir, round_)
        finally:
            os._exit(1)
    os.close(w)
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(r, 4096)
        if not chunk:
            raise RuntimeError("the child died before it was ready")
        line += chunk
    t = json.loads(line)
    start = {"context": t["context"] - t["forked"], "memory": t["memory"] - t["context"],
             "nccl": t["nccl"] - t["memory"], "nccl_again": t["nccl_again"] - t["nccl"]}
    pidfd = os.pidfd_open(pid)
    poll = select.poll()
    poll.register(r, select.POLLIN | select.POLLHUP)
    poll.register(pidfd, select.POLLIN)
    seen: dict[str, float] = {}
    t_kill = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    while len(seen) < 2:
        for fd, _ in poll.poll(5000):
            name = "pipe_eof" if fd == r else "pidfd"
            if name not in seen:
                seen[name] = time.monotonic() - t_kill
                poll.unregister(fd)
    os.waitpid(pid, 0)
    seen["reaped"] = time.monotonic() - t_kill
    os.close(r)
    os.close(pidfd)
    return {"start": {k: round(v, 4) for k, v in start.items()}, "after_kill": {k: round(v, 4) for k, v in seen.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--gib", type=float, default=2.0)
    a = ap.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.rounds):
            rounds.append(one_round(a.gib, d, i))
            time.sleep(0.5)

    def med(part: str, key: str) -> float:
        return round(statistics.median(r[part][key] for r in rounds), 4)

    print(json.dumps({"gib": a.gib, "medians": {part: {k: med(part, k) for k in rounds[0][part]}
                                                for part in ("start", "after_kill")}, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
