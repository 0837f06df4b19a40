"""The cross-process contract (resctl/profile/contract.py): every RESCTL_* name spelt there once, plan.json
and fatal.json read there, with the schema's defaults."""

from __future__ import annotations

import json
import re
from pathlib import Path

from resctl.profile import contract
from resctl.profile.schema import ENV_PREFIX, Health, env_name, keys

PKG = Path(__file__).resolve().parents[2] / "resctl"
#: Files that still spell a name themselves while their owner's rewrite lands; the test fails once one is clean.
PENDING: set[str] = set()
#: A profile key's own override is the schema's (`ENV_PREFIX` + the key), and its text names one.
KEY_OVERRIDES = {"profile/schema.py"}


def test_every_resctl_variable_is_named_in_the_contract_only() -> None:
    spelt: dict[str, list[str]] = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).as_posix()
        if rel == "profile/contract.py":
            continue
        found = re.findall(r"[\"'](RESCTL_[A-Z_]*)[\"']", path.read_text(encoding="utf-8"))
        if found:
            spelt[rel] = found
    assert {f: names for f, names in spelt.items() if f not in PENDING | KEY_OVERRIDES} == {}
    assert sorted(f for f in PENDING if f not in spelt) == [], "remove them from PENDING"
    overrides = {env_name(k) for k in keys()} | {ENV_PREFIX}
    assert [name for name in spelt.get("profile/schema.py", []) if name not in overrides] == []


def test_every_name_is_documented_once() -> None:
    names = {v for k, v in vars(contract).items() if k.isupper() and isinstance(v, str) and v.startswith("RESCTL_")}
    assert names == set(contract.ENV) and len(names) == 25


def test_handed_reads_the_environment_typed() -> None:
    handed = contract.Handed.of({contract.RUN_DIR: "/r", contract.PLAN: "/r/plan.json", contract.PRELOAD: "1"})
    assert handed == contract.Handed(Path("/r"), Path("/r/plan.json"), preload=True, verbose=False, debug=False)
    assert contract.Handed.of({}) == contract.Handed(None, None, False, False, False)


def test_plan_sections_are_typed_with_the_schemas_defaults(tmp_path: Path) -> None:
    plan = tmp_path / contract.PLAN_FILE
    plan.write_text(json.dumps({"profile": {"health": {"node_fault_limit": 3},
                                            "checkpoint": {"interval_steps": 50, "async": "yes"}}}))
    data = contract.read_plan(plan)
    limits = contract.health_limits(data)
    assert limits.node_fault_limit == 3 and limits.no_progress_cycles == Health().no_progress_cycles
    assert contract.planned_checkpoint(data) == contract.CheckpointPlan(50, None, None)  # "yes" is not a bool
    plan.write_text('{"profile": {"health": {"no_progress_cycles": Infinity, "node_fault_limit": 1e999}}}')
    assert contract.health_limits(contract.read_plan(plan)) == contract.HealthLimits()  # hand-edited: all off
    plan.write_text("{not json")
    assert contract.read_plan(plan) is None
    assert contract.health_limits(None) == contract.HealthLimits() and contract.planned_checkpoint(None).async_ is None
    assert contract.plan_from_env({}) is None


def test_fatal_json_first_writer_wins_and_secrets_are_redacted(tmp_path: Path) -> None:
    contract.record_fatal(tmp_path, {"exit_code": 2, "error": "see https://user:hunter2@host/x"})
    contract.record_fatal(tmp_path, {"exit_code": 3, "error": "second"})
    got = contract.read_fatal(tmp_path)
    assert got is not None and got["exit_code"] == 2 and "hunter2" not in got["error"]
    (tmp_path / contract.FATAL_FILE).write_text("[]")
    assert contract.read_fatal(tmp_path) is None
    assert [p.name for p in tmp_path.iterdir()] == [contract.FATAL_FILE]  # no temp file left
