"""Two real ranks (gloo, loopback) SIGKILLed at random moments while memory snapshots commit.

Run by tests/integration/test_memory_rollback.py and bench/bench_memory_rollback.py:

    python tests/integration/rollback_pair.py DIR --every 4 --kills 6 --seed 27 [--delay 0.06]

One process imports torch once and forks each incarnation of the two ranks (a restart costs a
fork, not an interpreter and a torch import), the way `resctl run`'s forked workers start. Each
incarnation loads (the real collective `Checkpointer.load`: the newest memory snapshot both ranks
hold and verify), checks the restored state, then trains: forward of an `nn.Module`, backward, an
all-reduce of the gradients (the collective that ties the ranks' steps together), optimizer step,
`maybe_save` with `checkpoint.memory_every = --every`. After a random number of seconds one rank
(each in turn) is SIGKILLed, the other a random moment later (what the launcher does to the survivors).

A commit on this box checksums a small state in microseconds; on a GPU a device-staged commit
(device-to-host copy and checksum of GBs) spans many steps (0.22 s = 15 steps on one H200). That
is what lets one rank run ahead of another's commit, so each rank's commit is stretched to
`--delay` seconds (rank 1) and a quarter of it (rank 0), before it writes the manifest.

Prints one JSON line per kill: `reached` (the newest step any rank finished before the kill),
`resumed` (the step the next incarnation loaded), `in_commit` (a commit was in flight on some
rank when it was killed), `span` (the most steps a commit spanned in that incarnation: the bound
is rollback <= every + min(span, every - 1), issue 31), then a summary line. Exit 1 if a restored state is not the step's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # imported once, here: every incarnation of a rank is a fork of this process
import torch.distributed as dist

from resctl.checkpoint import memdir
from resctl.checkpoint.engine import Checkpointer
from resctl.checkpoint.memory import MemoryTier

WIDTH = 32


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1))
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def progress(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def rank_main(rank: int, port_w: int, port: int, a: argparse.Namespace, incarnation: int, last: bool) -> None:
    """One incarnation of one rank (a forked child): load, check, train until killed."""
    torch.set_num_threads(1)
    log = os.open(Path(a.dir) / f"inc{incarnation}-rank{rank}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def note(text: str) -> None:
        os.write(log, text.encode() + b"\n")

    delay = a.delay if rank == 1 else a.delay / 4
    commit = MemoryTier._commit_slot

    def slow_commit(self: MemoryTier, snap: Any, *args: Any) -> None:
        note(f"c{snap.step}")
        time.sleep(delay)  # a GPU-sized commit (see the module docstring)
        commit(self, snap, *args)
        note(f"C{snap.step}")

    MemoryTier._commit_slot = slow_commit  # type: ignore[method-assign]
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=timedelta(seconds=60),
                          wait_for_workers=False)
    if rank == 0:
        os.write(port_w, f"{store.port}\n".encode())
    dist.init_process_group("gloo", store=dist.PrefixStore(f"inc{incarnation}", store), rank=rank, world_size=2)
    model, opt = build()
    state: dict[str, Any] = {"model": model, "optim": opt, "mark": torch.zeros(1 << 14)}
    ck = Checkpointer(dir=Path(a.dir) / "ck", interval_steps=10**9, memory_every=a.every, memory_replicate=False,
                      run_id="rollback-pair", rank=rank, world_size=2, async_=False)
    step = ck.load(state)
    good = bool(torch.all(state["mark"] == step))
    note(f"r{step}" if good else f"bad{step}")
    if last or not good:
        os._exit(0)
    x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(rank))
    while True:
        step += 1
        time.sleep(a.step_time)  # the step's compute
        model(x).pow(2).mean().backward()
        for p in model.parameters():
            assert p.grad is not None
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
        state["mark"].fill_(step)
        note(f"s{step}")
        ck.maybe_save(state, step)


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: a rank that would train on after this process died (a test timeout) is killed."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    if os.getppid() == 1:
        os._exit(1)


def spawn(a: argparse.Namespace, incarnation: int, last: bool) -> list[int]:
    """Fork rank 0 (it picks the store's port), then rank 1 with that port."""
    r, w = os.pipe()
    pids = []
    for rank in (0, 1):
        port = 0 if rank == 0 else int(os.read(r, 64).split()[0])
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                die_with_parent()
                rank_main(rank, w, port, a, incarnation, last)
            except BaseException:  # noqa: BLE001 - a child never returns into the parent's loop
                import traceback

                traceback.print_exc()
            os._exit(1)
        pids.append(pid)
    os.close(r)
    os.close(w)
    return pids


def wait_until(pred: Any, timeout: float, what: str, pids: list[int]) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.005)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    sys.exit(f"timed out waiting for {what}")


def commit_span(marks: list[str]) -> int:
    """The most steps a commit of this rank spanned: 1 + the steps it finished between a snapshot
    (`s<S>`, then `maybe_save`) and that snapshot's commit (`C<S>`, or the kill). A commit shorter
    than a step spans 1."""
    at: dict[int, int] = {}  # snapshot step -> steps finished when it was taken
    done = 0
    span = 1
    for t in marks:
        if t.startswith("s"):
            done += 1
            at[int(t[1:])] = done
        elif t.startswith("C") and int(t[1:]) in at:
            span = max(span, 1 + done - at.pop(int(t[1:])))
    for n in {int(t[1:]) for t in marks if t.startswith("c")} & at.keys():  # a commit the kill interrupted
        span = max(span, 1 + done - at[n])
    return span


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--delay", type=float, default=0.06, help="seconds a rank-1 commit takes (rank 0: a quarter)")
    ap.add_argument("--step-time", type=float, default=0.004)
    ap.add_argument("--window", type=float, default=0.4, help="a kill lands 0..WINDOW s after training began")
    a = ap.parse_args()
    torch.set_num_threads(1)  # no intra-op thread pool in the parent of forks
    build()  # the optimizer's first use imports seconds' worth of modules: once, here
    os.environ[memdir.SHM_ENV] = str(Path(a.dir) / "shm")
    os.environ[memdir.LAUNCH_ENV] = "pair"
    rng = random.Random(a.seed)
    results: list[dict[str, Any]] = []
    for inc in range(a.kills + 1):
        last = inc == a.kills
        pids = spawn(a, inc, last)
        files = [Path(a.dir) / f"inc{inc}-rank{rank}" for rank in (0, 1)]

        def loaded(fs: list[Path] = files) -> list[str] | None:
            first = [next((t for t in progress(f) if t.startswith(("r", "bad"))), None) for f in fs]
            return first if all(first) else None  # type: ignore[return-value]

        got = wait_until(loaded, 120, f"incarnation {inc} to load", pids)
        if any(t.startswith("bad") for t in got) or got[0] != got[1]:
            sys.exit(f"incarnation {inc}: restored {got} (a state not of the step loaded, or ranks apart)")
        resumed = int(got[0][1:])
        if results:
            results[-1]["resumed"] = resumed
            print(json.dumps(results[-1]), flush=True)
        if last:
            for pid in pids:
                os.waitpid(pid, 0)
            break
        # Train a while (past the first snapshot after the load), then kill at a random moment.
        wait_until(lambda fs=files: all(sum(t.startswith("s") for t in progress(f)) > a.every for f in fs), 120,
                   f"incarnation {inc} to train", pids)
        time.sleep(rng.uniform(0, a.window))
        victim = inc % 2  # each rank in turn
        os.kill(pids[victim], signal.SIGKILL)
        time.sleep(rng.uniform(0, 0.02))
        os.kill(pids[1 - victim], signal.SIGKILL)
        for pid in pids:
            os.waitpid(pid, 0)
        marks = [progress(f) for f in files]
        reached = max(int(t[1:]) for m in marks for t in m if t.startswith("s"))
        in_commit = any(sum(t.startswith("c") for t in m) > sum(t.startswith("C") for t in m) for m in marks)
        results.append({"kill": inc, "victim": victim, "reached": reached, "in_commit": in_commit,
                        "span": max(commit_span(m) for m in marks)})
    rollbacks = [r["reached"] - r["resumed"] for r in results]
    print(json.dumps({"every": a.every, "kills": len(results), "rollback_max": max(rollbacks),
                      "rollbacks": rollbacks, "in_commit": sum(r["in_commit"] for r in results)}), flush=True)


if __name__ == "__main__":
    main()
