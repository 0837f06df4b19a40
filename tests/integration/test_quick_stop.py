"""A dead rank costs seconds even when the survivor cannot run a Python signal handler.

When a rank dies, its peer sits in a collective that never completes (an NCCL kernel wait, a CUDA
sync, a gloo recv): Python runs a SIGTERM handler only between bytecodes, so a handler in that rank
never runs. On CPU `--block-sigterm --stall-at 12:0` reproduces exactly that: the main thread blocks
SIGTERM and rank 0 sleeps in native code at step 12, when rank 1 is SIGKILLed (a gloo collective
would fail at once when its peer's socket closes, which hides the problem). Before resctl's
quick restart stops the launcher waited 30 s for it (torch's hard-coded grace for forked workers) or
`workers_stop_timeout` (exec'd workers). The survivor's stop is bounded here (10 s, against the 30 s grace); the
issue's kill -> both resumed targets (3 s forked, 6 s exec'd) are measured in docs/BENCHMARKS.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.jobs import events
from tests.integration.test_recovery import assert_same_final, job, run

pytestmark = pytest.mark.slow


def kill_to_resume(run_dir: Path) -> float:
    ev = events(run_dir)
    kill = next(e for e in ev if e["kind"] == "fault" and e["cause"] == "sigkill")
    resumes = [e["t"] for e in ev if e["kind"] == "resume" and e["cycle"] == kill["cycle"] + 1]
    assert len(resumes) == 2, ev
    return max(resumes) - kill["t"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("quick-stop-ref")
    run([*job(tmp, "ref", 2), "--block-sigterm"], cwd=tmp)
    return tmp / "ref.pt"


#: The survivor's own stop: it was the 30 s torch grace (forked) or workers_stop_timeout (exec'd); now the
#: launcher's restart stop ends it at once (well under a second quiet; the bound leaves a loaded box its latency).
STOP_BOUND = 10.0
#: torch's hard-coded grace for forked workers, which the launcher waited before it started any new worker (30.9 s
#: kill -> both resumed before). The new cycle's workers must be spawned sooner: what the fix changed. Kill -> both
#: resumed adds their start (imports, init_process_group, the resume), which only load decides (20.4 s once in
#: CI-like pass 2 with exec'd workers beside other test runs); the issue's speed targets (3 s forked, 6 s exec'd)
#: are measured, not asserted (docs/BENCHMARKS.md).
TORCH_GRACE = 30.0


@pytest.mark.parametrize("worker_start", ["fork", "exec"])
def test_a_survivor_that_cannot_handle_sigterm_does_not_hold_the_restart(
    tmp_path: Path, reference: Path, worker_start: str
) -> None:
    args = [*job(tmp_path, "kill", 2, sets=(f"launch.worker_start={worker_start}",)), "--block-sigterm",
            "--stall-at", "12:0"]
    run(args, cwd=tmp_path, faults="sigkill@12:1")
    ev = events(tmp_path / "kill")
    stopped = [e for e in ev if e["kind"] == "end" and e.get("status") == "restart-stop"]
    assert [e["rank"] for e in stopped] == [0], "the survivor left on the launcher's restart stop"
    kill = next(e for e in ev if e["kind"] == "fault" and e["cause"] == "sigkill")
    assert stopped[0]["t"] - kill["t"] <= STOP_BOUND, f"the survivor stopped {stopped[0]['t'] - kill['t']:.2f}s after the kill"
    spawned = min(e["spawned"] for e in ev if e["kind"] == "start" and e["cycle"] == kill["cycle"] + 1)
    took = kill_to_resume(tmp_path / "kill")
    assert spawned - kill["t"] < TORCH_GRACE, \
        f"the new workers were spawned {spawned - kill['t']:.2f}s after the kill (resumed after {took:.2f}s)"
    assert_same_final(tmp_path / "kill.pt", reference)


@pytest.mark.nvrx_series("0.4")  # in-process restart: NVRx 0.4 only (docs/recovery.md, issue 30)
def test_sigkill_with_inprocess_on_finishes_once_and_exact(tmp_path: Path, reference: Path) -> None:
    """The survivor must not carry on alone in a world of 1 (the old default min_world_size = 1):
    it hands over to the launcher, and training finishes once, bitwise equal."""
    run([*job(tmp_path, "inproc", 2, inprocess=True), "--block-sigterm", "--stall-at", "12:0"],
        cwd=tmp_path, faults="sigkill@12:1")
    ev = events(tmp_path / "inproc")
    finished = [(e["rank"], e["cycle"]) for e in ev if e["kind"] == "end" and e.get("status") == "ok"]
    assert sorted(finished) == [(0, 1), (1, 1)], finished
    assert not [e for e in ev if e["kind"] == "step" and e["cycle"] == 0 and e["step"] > 13], "no training alone"
    assert_same_final(tmp_path / "inproc.pt", reference)
