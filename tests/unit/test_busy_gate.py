"""DDP's buckets are timed only once steps are long (resctl.shim.busy, issue 31): a Python comm hook in place
of DDP's C++ all-reduce costs tens of microseconds a step, several percent of a tiny CUDA step. A real DDP
module on a one-rank gloo group, in its own process; the threshold is set per case, not a clock's verdict."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

from tests.zygote import zygote

WORKER = textwrap.dedent(
    """
    import json, sys, time, warnings
    warnings.filterwarnings("ignore")
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from resctl.patching import Patches
    from resctl.shim import busy

    store, case = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    busy.TIMED_FROM_S = {"fast": 3600.0, "slow": 0.0, "own": 3600.0}[case]
    clock, patches = busy.BusyClock(), Patches("test")
    off = busy.install(clock, patches)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 8))
    own = []
    if case == "own":  # the script's own hook: wrapped at once, whatever the steps' length
        def mine(state, bucket):
            own.append(1)
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        model.register_comm_hook(None, mine)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    clock.start = time.monotonic()
    out = {"busy": [], "hooked": []}
    for step in range(busy.WARMUP + 3 * busy.WINDOW):
        time.sleep(0.005)  # the rank's own work before its gradients are ready
        model(torch.ones(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        if step == 0:
            off()
        out["busy"].append(clock.boundary(time.monotonic()))
        out["hooked"].append(getattr(model, "_resctl_busy_slot", None) is not None)
    out["own_calls"] = len(own)
    out["weight"] = model.module.weight.detach().flatten().tolist()
    patches.undo()
    dist.destroy_process_group()
    print(json.dumps(out), flush=True)
    """
)


def _run(tmp_path: Path, case: str) -> dict:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    proc = zygote().run([sys.executable, str(script), str(tmp_path / f"store-{case}"), case], text=True, timeout=180,
                        env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_buckets_are_timed_from_the_boundary_where_steps_are_long(tmp_path: Path) -> None:
    from resctl.shim.busy import WARMUP, WINDOW

    fast, slow = _run(tmp_path, "fast"), _run(tmp_path, "slow")
    # Steps shorter than the threshold: DDP keeps its C++ all-reduce, nothing timed.
    assert not any(fast["hooked"]) and all(b is None for b in fast["busy"]), fast
    # Long steps: after the warm-up the window fills at step WARMUP + WINDOW - 1's boundary, the hook from there
    # on, a busy time from the next.
    n = WARMUP + WINDOW
    assert slow["hooked"] == [False] * (n - 1) + [True] * (2 * WINDOW + 1), slow["hooked"]
    assert all(b is None for b in slow["busy"][:n]), slow["busy"]
    assert all(b is not None and b >= 0.005 for b in slow["busy"][n:]), slow["busy"]
    # The timed hook is DDP's own all-reduce (`allreduce_hook`): attaching it mid-run changes no number.
    assert fast["weight"] == slow["weight"]


def test_the_scripts_own_hook_is_wrapped_at_once_and_still_runs(tmp_path: Path) -> None:
    from resctl.shim.busy import WARMUP, WINDOW

    got = _run(tmp_path, "own")
    assert all(got["hooked"]) and got["own_calls"] == WARMUP + 3 * WINDOW, got
    assert all(b is not None and b >= 0.005 for b in got["busy"][1:]), got["busy"]


def test_a_cuda_timing_failure_is_no_busy_time_and_never_reaches_the_step() -> None:
    """The busy clock runs in the optimizer's post-hook: CUDA refusing an event (two devices' events, one not
    recorded) must cost the straggler measure, never the user's `optimizer.step()`."""
    import time

    from resctl.shim.busy import BusyClock, CudaSteps

    class Refused:
        def query(self) -> bool:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")

    class CudaGrad:
        is_cuda = True
        device = "cuda:1"

    clock = BusyClock()
    clock.reporting = True
    clock._cuda = steps = CudaSteps("cuda:1")
    steps.start, steps.record = Refused(), Refused  # type: ignore[method-assign]
    assert clock.boundary(time.monotonic()) is None
    clock.bucket_issued(CudaGrad())  # timing is off from now on: no new event is made
    clock.wait_end(clock.wait_begin())  # nor for a wait
    assert clock._cuda is None and clock.boundary(time.monotonic()) is None
