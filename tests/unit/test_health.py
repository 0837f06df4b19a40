"""Health that acts, the pure parts: the no-progress decision, the launcher's gate over real events files,
the straggler detector."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resctl.health.gate import Gate
from resctl.health.progress import ProgressTracker
from resctl.health.stragglers import RECENT, StragglerDetector, _median_without
from resctl.telemetry.events import EventLog


def test_cycles_without_a_new_step_stop_after_the_limit_the_first_cycle_included() -> None:
    t = ProgressTracker(limit=2)
    assert t.cycle_ended(None) is None  # cycle 0 crashed before its first step
    verdict = t.cycle_ended(None)
    assert verdict is not None and verdict.cycles == 2 and verdict.best == 0
    assert "no step at all" in verdict.message() and "health.no_progress_cycles = 2" in verdict.message()


def test_a_cycle_beyond_the_best_step_resets_the_count_and_a_rolled_back_replay_does_not() -> None:
    t = ProgressTracker(limit=2)
    assert t.cycle_ended(40, resumed=0) is None  # progress
    assert t.cycle_ended(35) is None  # rolled back to 30, died at 35: no new step
    assert t.cycle_ended(41) is None  # one new step: progress, count back to 0
    assert t.cycle_ended(41) is None
    verdict = t.cycle_ended(None)
    assert verdict is not None and verdict.best == 41


def test_the_first_cycle_resumed_from_a_checkpoint_counts_its_step_as_seen() -> None:
    t = ProgressTracker(limit=1)
    verdict = t.cycle_ended(None, resumed=500)  # resumed at 500 and died before step 501
    assert verdict is not None and verdict.best == 500
    assert ProgressTracker(limit=1).cycle_ended(501, resumed=500) is None


@given(st.lists(st.one_of(st.none(), st.integers(0, 50)), max_size=30), st.integers(1, 5))
def test_the_stop_comes_exactly_after_limit_cycles_in_a_row_without_a_new_best(reached: list[int | None],
                                                                                limit: int) -> None:
    t, best, stalled = ProgressTracker(limit), 0, 0
    for r in reached:
        verdict = t.cycle_ended(r)
        if r is not None and r > best:
            best, stalled = r, 0
        else:
            stalled += 1
        assert (verdict is not None) == (stalled >= limit)


def _step(log: EventLog, *steps: int) -> None:
    for s in steps:
        log.step(s, 0.01)
    log.flush()


def test_the_gate_reads_only_what_each_cycle_appended(tmp_path: Path) -> None:
    gate = Gate(tmp_path, limit=2)
    old = EventLog(tmp_path, 0)
    _step(old, 1, 2, 3)  # an earlier run's lines (a requeue): not this run's progress
    assert gate.before_cycle() is None  # cycle 0 begins
    _step(old, 4, 5)
    assert gate.before_cycle() is None  # cycle 0 reached 5: progress
    assert gate.before_cycle() is None  # cycle 1: nothing written (died before its start line)
    other = EventLog(tmp_path, 1, cycle=2)
    other.emit("resume", step=5)
    _step(other, 5)  # replays 5, no new step
    verdict = gate.before_cycle()
    assert verdict is not None and verdict.cycles == 2 and verdict.best == 5


def test_the_gate_reads_at_most_the_end_of_a_long_cycle(tmp_path: Path, monkeypatch) -> None:
    import resctl.health.gate as gate_mod

    monkeypatch.setattr(gate_mod, "SCAN_BYTES", 4096)
    gate = Gate(tmp_path, limit=1)
    gate.before_cycle()
    _step(EventLog(tmp_path, 0), *range(1, 2001))
    assert gate.before_cycle() is None and gate.tracker.best == 2000


def test_the_launcher_gate_reads_its_limit_from_the_plan(tmp_path: Path, monkeypatch) -> None:
    import resctl.health.gate as gate_mod

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"profile": {"health": {"no_progress_cycles": 3}}}))
    monkeypatch.setenv("RESCTL_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RESCTL_PLAN", str(plan))
    monkeypatch.setattr(gate_mod, "_GATE", [])
    gate = gate_mod._gate()
    assert gate is not None and gate.tracker.limit == 3
    plan.write_text(json.dumps({"profile": {"health": {"no_progress_cycles": 0}}}))
    monkeypatch.setattr(gate_mod, "_GATE", [])
    assert gate_mod._gate() is None


def test_the_guard_is_on_at_3_by_default_and_the_report_says_so_or_what_it_did() -> None:
    from resctl.profile.schema import Profile
    from resctl.telemetry.report_rows import crash_loop_guard

    assert Profile().health.no_progress_cycles == 3  # NVRx >= 0.6's default
    from resctl.profile.contract import health_limits

    assert health_limits({"profile": {"health": {}}}).no_progress_cycles == 3  # a plan without the key: the default
    assert "on: stops (exit 93) after 3" in crash_loop_guard(3, None)
    assert crash_loop_guard(0, None).startswith("off")
    fatal = {"cause": "no_progress", "exit_code": 93, "error": "no progress in 3 launcher cycle(s)"}
    assert crash_loop_guard(3, fatal) == "stopped the job (exit 93): no progress in 3 launcher cycle(s)"
    assert crash_loop_guard(None, None) == ""  # no plan.json: nothing to say


def _feed(d: StragglerDetector, durations: dict[int, float], step: int, t: float = 0.0):
    found = []
    for rank, dur in durations.items():
        s = d.feed({"kind": "step", "rank": rank, "cycle": 0, "iteration": 0, "step": step, "duration": dur, "t": t})
        if s is not None:
            found.append(s)
    return found


def test_a_rank_slower_than_the_others_by_the_margin_is_named_once_per_episode() -> None:
    d = StragglerDetector(margin=0.5, steps=5)
    named = []
    for step in range(1, 80):
        slow = 15 <= step < 40 or step >= 60
        named += [(s.rank, step) for s in _feed(d, {0: 0.1, 1: 0.1, 2: 0.25 if slow else 0.1, 3: 0.1}, step)]
    assert [r for r, _ in named] == [2, 2], named  # two episodes, each said once
    first = named[0][1]
    assert 15 + 5 <= first <= 15 + 5 + RECENT, first
    assert d.recent()[2] == 0.25 and d.named() == [2]


def test_even_ranks_and_tiny_steps_are_never_named() -> None:
    d = StragglerDetector(margin=0.2, steps=3)
    for step in range(1, 50):
        assert not _feed(d, {0: 0.05, 1: 0.051, 2: 0.049}, step)
    d = StragglerDetector(margin=0.2, steps=3)
    for step in range(1, 50):
        assert not _feed(d, {0: 0.0001, 1: 0.004}, step)  # below FLOOR: timer noise


def _feed_sync(d: StragglerDetector, busy: dict[int, float], step: int):
    """A DDP step: every rank's step takes the slowest rank's time; `busy` is each rank's own work."""
    wall = max(busy.values()) + 0.002
    found = []
    for rank, b in busy.items():
        s = d.feed({"kind": "step", "rank": rank, "cycle": 0, "iteration": 0, "step": step, "duration": wall,
                    "busy": b, "t": 0.0})
        if s is not None:
            found.append(s)
    return found


def test_in_a_synchronous_job_the_rank_the_others_wait_for_is_named_by_its_own_work() -> None:
    d = StragglerDetector(margin=0.5, steps=20)
    named = []
    for step in range(1, 151):
        named += _feed_sync(d, {0: 0.0008, 1: 0.0408 if step >= 10 else 0.0008}, step)  # 40 ms more from step 10
    assert [s.rank for s in named] == [1] and named[0].measure == "busy", named
    assert "its own work outside the collectives it waits in" in named[0].message()
    assert named[0].step <= 10 + 20 + RECENT
    balanced = StragglerDetector(margin=0.5, steps=20)
    for step in range(1, 151):  # 4 even ranks with jitter of a few ms (a loaded box): no one named
        assert not _feed_sync(balanced, {r: 0.001 + 0.003 * ((step * (r + 1)) % 3) for r in range(4)}, step)


def test_the_report_compares_ranks_by_their_own_work_when_every_rank_has_it() -> None:
    from resctl.telemetry.ranks import RankSteps
    from resctl.telemetry.report_rows import rank_rows

    table = RankSteps()
    for step in range(1, 40):
        for rank, busy in ((0, 0.001), (1, 0.041)):
            table.feed({"kind": "step", "rank": rank, "cycle": 0, "iteration": 0, "step": step, "duration": 0.043,
                        "busy": busy, "t": 0.0})
    rows = {r["rank"]: r for r in table.rows()}
    assert rows[1]["ratio_of"] == "busy" and rows[1]["ratio"] > 30 and rows[0]["ratio"] < 0.1
    assert abs(rows[0]["median_s"] - 0.043) < 0.001  # step times alone: equal
    title, shown = rank_rows(table.rows()) or ("", [])
    assert "own work" in title and shown[1][4].startswith("0.04")


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=2, max_size=200), st.data())
def test_the_median_without_one_rank_is_the_median_of_the_others(values: list[float], data) -> None:
    import statistics

    values.sort()
    own = data.draw(st.sampled_from(values))
    others = list(values)
    others.remove(own)
    assert abs(_median_without(values, own) - statistics.median(others)) < 1e-9


def _uneven_run(run_dir: Path) -> None:
    """Three ranks of 0.1 s steps; rank 2's steps take 0.3 s from step 10, and the watch named it."""
    for rank in range(3):
        log = EventLog(run_dir, rank)
        for step in range(1, 31):
            log.step(step, 0.3 if rank == 2 and step >= 10 else 0.1)
        if rank == 2:
            log.emit("straggler", step=20, seconds=0.3, median=0.1, ratio=3.0, steps=8, margin=0.5)
        log.close()


def test_the_report_table_and_the_metrics_show_each_ranks_step_time_and_the_named_one(tmp_path: Path) -> None:
    from resctl.telemetry.events import read_run
    from resctl.telemetry.metrics import RunCollector
    from resctl.telemetry.ranks import RankSteps

    _uneven_run(tmp_path)
    table = RankSteps()
    list(table.watch(read_run(tmp_path)))
    rows = {r["rank"]: r for r in table.rows()}
    assert rows[0]["steps"] == 29 and abs(rows[0]["median_s"] - 0.1) < 0.002
    assert abs(rows[2]["ratio"] - 3.0) < 0.1 and rows[2]["straggler_events"] == 1 and rows[2]["named_at_step"] == 20
    assert rows[0]["straggler_events"] == 0

    collector = RunCollector(tmp_path)
    collector.update()
    families = {f.name: f for f in collector.collect()}
    assert families["resctl_stragglers"].samples[0].value == 1
    per_rank = {s.labels["rank"]: s.value for s in families["resctl_rank_step_seconds"].samples}
    assert per_rank == {"0": 0.1, "1": 0.1, "2": 0.3}


def test_the_report_names_the_straggler_in_its_per_rank_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from resctl.cli import app, render

    for console in (render.out_console, render.err_console):  # a narrow COLUMNS (CI's) wraps the straggler cell
        monkeypatch.setattr(console, "width", 200)

    _uneven_run(tmp_path)
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "step time per rank" in result.output and "named x1 (step 20)" in result.output
    doc = CliRunner().invoke(app, ["report", str(tmp_path), "--json"])
    assert json.loads(doc.stdout)["rank_steps"][2]["straggler_events"] == 1


def _cfg(**kw):
    from resctl.health.preflight import Config

    base = dict(host="h", port=1, nnodes_min=4, nnodes_max=4, is_host=True, node_rank=0, margin=0.5)
    return Config(**{**base, **kw})


def _results(n: int, gflops: dict[int, float] | None = None, slow_link: int | None = None) -> dict[int, dict]:
    out: dict[int, dict] = {r: {"gflops": (gflops or {}).get(r, 100.0), "pairs": {}, "all_gbps": 1.0,
                                "all_latency_ms": 0.1} for r in range(n)}
    for a in range(n):
        for b in range(a + 1, n):
            out[a]["pairs"][str(b)] = {"gbps": 0.05 if slow_link in (a, b) else 1.0, "latency_ms": 0.1}
    return out


def test_the_judge_names_a_slow_link_and_a_slow_device_with_their_numbers() -> None:
    from resctl.health.preflight import judge

    v = judge(_cfg(), [0, 1, 2, 3], _results(4, {3: 20.0}, slow_link=2), {r: f"n{r}" for r in range(4)})
    status = {n["rank"]: n["status"] for n in v.nodes}
    assert status == {0: "ok", 1: "ok", 2: "slow", 3: "slow"} and v.action == "fail"
    why = {n["rank"]: n["why"] for n in v.nodes}
    assert "links 0.05 GB/s vs the others' 1" in why[2] and "matmul 20 GFLOP/s vs the others' 100" in why[3]


def test_a_slow_link_is_named_beside_a_slow_cpu_whose_links_are_slow_too() -> None:
    """What the netns test measured: node 2's link throttled (0.019 GB/s), node 3's CPU at 3 % (its links at
    0.047: gloo moves bytes on that CPU), the healthy links 0.08. Judged by each node's median link, node 2
    (0.019) was within 3x of the others' (0.047): only node 3 was named."""
    from resctl.health.preflight import judge

    res = _results(4, {3: 3.5})
    gbps = {(0, 1): 0.08, (0, 2): 0.019, (0, 3): 0.047, (1, 2): 0.019, (1, 3): 0.047, (2, 3): 0.019}
    for (a, b), g in gbps.items():
        res[a]["pairs"][str(b)]["gbps"] = g
    v = judge(_cfg(margin=2.0), [0, 1, 2, 3], res, {})
    status = {n["rank"]: n["status"] for n in v.nodes}
    why = {n["rank"]: n["why"] for n in v.nodes}
    assert status == {0: "ok", 1: "ok", 2: "slow", 3: "slow"}, why
    assert "links 0.019 GB/s vs the others' 0.08" in why[2] and "matmul" in why[3] and "links" not in why[3]


def test_exclusion_leaves_out_the_bad_nodes_only_when_enough_are_left() -> None:
    from resctl.health.preflight import judge

    hosts = {r: f"n{r}" for r in range(3)}
    v = judge(_cfg(policy="exclude", nnodes_min=2, nnodes_max=3), [0, 1, 2], _results(3, {1: 10.0}), hosts)
    assert v.action == "exclude" and v.excluded == [1]
    v = judge(_cfg(policy="exclude", nnodes_min=3, nnodes_max=3), [0, 1, 2], _results(3, {1: 10.0}), hosts)
    assert v.action == "fail" and "fewer than launch.nnodes' minimum 3" in v.message
    v = judge(_cfg(policy="warn", nnodes_min=3, nnodes_max=3), [0, 1, 2], _results(3, {1: 10.0}), hosts)
    assert v.action == "ok" and "warn" in v.message


def test_a_node_that_never_joined_or_failed_a_test_is_broken() -> None:
    from resctl.health.preflight import judge

    results = _results(3)
    results[1] = {"error": "RuntimeError: connection reset"}
    v = judge(_cfg(nnodes_min=3, nnodes_max=4, policy="exclude"), [0, 1, 2], results, {0: "a", 1: "b", 2: "c"})
    rows = {n["rank"]: n for n in v.nodes}
    assert rows[1]["status"] == "broken" and "connection reset" in rows[1]["why"]
    assert rows[3]["status"] == "broken" and "did not join" in rows[3]["why"]
    assert v.action == "fail"  # two good nodes left, fewer than the minimum of 3


def test_two_nodes_share_their_one_link_so_only_an_absolute_floor_judges_it() -> None:
    from resctl.health.preflight import judge

    res = _results(2, slow_link=1)
    assert judge(_cfg(nnodes_min=2, nnodes_max=2), [0, 1], res, {}).action == "ok"
    v = judge(_cfg(nnodes_min=2, nnodes_max=2, min_gbps=0.5), [0, 1], res, {})
    assert v.action == "fail" and all("under health.preflight_min_gbps" in n["why"] for n in v.nodes)


def test_round_robin_rounds_cover_every_pair_once_with_disjoint_pairs() -> None:
    from resctl.health.preflight import rounds

    for n in range(1, 9):
        pairs = [p for r in rounds(n) for p in r]
        assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
        assert all(len({x for p in r for x in p}) == 2 * len(r) for r in rounds(n))


def test_the_slurm_drain_command_names_the_node_and_says_why() -> None:
    from resctl.health.placement import BadNode, drain_argv, requeue_argv, scheduler

    argv = drain_argv(BadNode("n2", "preflight: slow:\n links 0.02 GB/s"))
    assert argv == ["scontrol", "update", "nodename=n2", "state=drain", "reason=resctl: preflight: slow: links 0.02 GB/s"]
    assert requeue_argv("17") == ["scontrol", "requeue", "17"]
    assert scheduler({"SLURM_JOB_ID": "1"}, "auto") == "slurm"
    assert scheduler({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, "auto") == "kubernetes"
    assert scheduler({"SLURM_JOB_ID": "1"}, "off") is None and scheduler({}, "auto") is None


def test_a_requeue_asks_for_the_good_nodes_when_the_range_allows_fewer_and_keeps_the_count_otherwise() -> None:
    from resctl.health.cluster import requeue_nodes
    from resctl.health.preflight import judge

    hosts = {0: "n1", 1: "n2", 2: "n3"}
    for low, want in ((1, 2), (2, 2), (3, None)):
        cfg = _cfg(nnodes_min=low, nnodes_max=3, expected_hosts=("n1", "n2", "n3"))
        v = judge(cfg, [0, 2], _results(3), hosts)  # n2 never joined
        assert v.action == "fail" and requeue_nodes(cfg, v) == want, (low, v.nodes)


def test_a_requeue_on_fewer_nodes_is_left_to_the_batch_script_when_it_asks(tmp_path: Path) -> None:
    from resctl.health.placement import REQUEUE_FILE_ENV, requeue, requeue_updates

    assert requeue_updates(None) == [] and requeue_updates(3) == ["NumNodes=3", "NumTasks=3"]
    asked = tmp_path / "req"
    said = requeue({"SLURM_JOB_ID": "7", REQUEUE_FILE_ENV: str(asked)}, nodes=1)
    assert asked.read_text() == "NumNodes=1 NumTasks=1\n" and "requeued on 1 node(s) by the batch script" in said
    requeue({"SLURM_JOB_ID": "7", REQUEUE_FILE_ENV: str(asked)})
    assert asked.read_text() == "\n"  # a requeue as the job is
    assert requeue({}) == "no SLURM_JOB_ID: not requeued"


def test_a_slurm_node_range_is_capped_at_the_allocation(tmp_path: Path) -> None:
    from resctl.launch.rendezvous import detect
    from resctl.profile.schema import Launch

    env = {"SLURM_JOB_ID": "7", "SLURM_NODEID": "0", "SLURM_STEP_ID": "0"}
    one = detect(Launch(nnodes="1:2"), {**env, "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NODELIST": "n1"}, "n1",
                 root=tmp_path)
    assert one.nnodes == "1" and any("capped" in n for n in one.notes)
    two = detect(Launch(nnodes="1:4"), {**env, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "n[1-2]"}, "n1",
                 root=tmp_path)
    assert two.nnodes == "1:2"
    assert detect(Launch(nnodes="1:2"), {**env, "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "n[1-2]"}, "n1",
                  root=tmp_path).nnodes is None  # the profile's range, as it is


def test_the_gate_blames_the_rank_that_died_without_a_word_then_the_first_to_fault(tmp_path: Path) -> None:
    gate = Gate(tmp_path, limit=0, fault_limit=2)
    gate.before_cycle()
    logs = [EventLog(tmp_path, r) for r in range(4)]
    for log in logs:
        log.emit("start", pid=1)
    logs[0].emit("fault", cause="exception", error="peer closed")  # rank 2 was SIGKILLed: no record of its own
    logs[1].emit("fault", cause="exception", error="peer closed")
    logs[3].emit("end", status="error")
    assert gate.before_cycle(own_ranks=[2, 3]) is None and gate.own_faults == 1
    for log in logs:
        log.emit("start", pid=1)
    logs[3].emit("fault", cause="exception", error="CUDA error")  # the first to fault, then the others
    for r in (0, 1, 2):
        logs[r].emit("fault", cause="exception", error="peer closed")
    assert gate.before_cycle(own_ranks=[0, 1]) is None and gate.own_faults == 1, "not this node's fault"
    for log in logs:
        log.emit("start", pid=1)
    logs[0].emit("fault", cause="exception", error="peer closed")
    logs[1].emit("fault", cause="exception", error="peer closed")
    logs[3].emit("end", status="error")
    verdict = gate.before_cycle(own_ranks=[2, 3])
    assert verdict is not None and verdict.faults == 2 and verdict.ranks == [2]
    assert "health.node_fault_limit = 2" in verdict.message()
