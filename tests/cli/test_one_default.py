"""One default per setting: the profile schema states it, and every other place that states it agrees
(`profile show`, `profile init`, `run --help`, `--dry-run`, the README and docs/, doctor)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import tomllib

from resctl.profile.render import _toml, default_text
from resctl.profile.schema import SECTIONS, Profile, is_duration, keys
from resctl.profile.units import parse_duration

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
DEFAULTS = Profile()


def default(dotted: str) -> Any:
    section, fld = keys()[dotted]
    return getattr(getattr(DEFAULTS, section), fld)


def resctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RESCTL_")}
    return subprocess.run([sys.executable, "-m", "resctl", *args], cwd=cwd, capture_output=True, text=True,
                          env={**env, "COLUMNS": "200", "HOME": str(cwd)}, timeout=60)


def test_profile_show_prints_the_schema_defaults(tmp_path: Path) -> None:
    shown = json.loads(resctl("profile", "show", "--json", cwd=tmp_path).stdout)
    assert shown["profile"] == DEFAULTS.model_dump(mode="json", by_alias=True)
    assert set(shown["sources"].values()) == {"default"}


def test_profile_init_writes_the_schema_defaults(tmp_path: Path) -> None:
    assert resctl("profile", "init", "starter.toml", cwd=tmp_path).returncode == 0
    text = (tmp_path / "starter.toml").read_text()
    # every `#key = value` line, uncommented, is the default
    uncommented = "\n".join(line[1:] if re.match(r"#[a-z_]+ = ", line) else line for line in text.splitlines())
    (tmp_path / "uncommented.toml").write_text(uncommented)
    data = tomllib.loads(uncommented)
    assert sum(len(v) for v in data.values()) > 60, "the starter profile lists the keys"
    shown = json.loads(resctl("profile", "show", "--json", "-p", "uncommented.toml", cwd=tmp_path).stdout)
    assert shown["profile"] == DEFAULTS.model_dump(mode="json", by_alias=True)


def test_run_help_states_the_schema_defaults(tmp_path: Path) -> None:
    from resctl.cli.torchrun_flags import FLAGS

    page = " ".join(resctl("run", "--help", cwd=tmp_path).stdout.split())
    stated = dict(re.findall(r"\[([a-z_]+\.[a-z_]+), default ([^\]]+)\]", page))
    profile_flags = [f for f in FLAGS if f.to in ("profile", "resctl") and f.type is not bool and default_text(f.key)]
    assert {f.key for f in profile_flags} <= set(stated), "every profile flag says its key and default"
    for key, value in stated.items():
        assert value == default_text(key), key
    for flag in profile_flags:  # and no hand-written default beside it
        assert "default" not in flag.help, flag.dest


def test_dry_run_launches_with_the_schema_defaults(tmp_path: Path) -> None:
    """`--dry-run` with no profile, and with every key set to its schema default by --set: the same
    command, and each `<- --set KEY` line says which key a launcher flag comes from."""
    (tmp_path / "train.py").write_text("")
    sets: list[str] = []
    for dotted, (section, fld) in keys().items():
        value = default(dotted)
        if value is None or isinstance(value, (dict, list)) or section == "doctor":
            continue
        sets += ["--set", f"{dotted}={_toml(section, fld, value)}"]
    plain = resctl("run", "--dry-run", "train.py", cwd=tmp_path)
    explicit = resctl("run", *sets, "--dry-run", "train.py", cwd=tmp_path)
    assert plain.returncode == 0 and explicit.returncode == 0, plain.stderr + explicit.stderr

    def settings(out: str) -> dict[str, tuple[str, str]]:
        lines = out.partition("# where each setting came from")[2].partition("\n\n")[0].splitlines()[1:]
        run_id = re.compile(r"\d{8}-\d{6}-[0-9a-f]{8}")  # each dry run makes its own
        return {m[1]: (run_id.sub("RUN_ID", m[2]), m[3])
                for m in (re.match(r"(--\S+) (.*?)\s+<- (.*)", line) for line in lines) if m}

    got, want = settings(plain.stdout), settings(explicit.stdout)
    from_keys = {flag: source.removeprefix("--set ") for flag, (_, source) in want.items() if source.startswith("--set ")}
    assert len(from_keys) >= 10 and "--start-method" in from_keys and "--max-restarts" in from_keys, want
    for flag, key in from_keys.items():
        assert got[flag] == (want[flag][0], "default"), (flag, key, got[flag], want[flag])


# --- what the README and docs/ say -------------------------------------------------------------

KEY = r"(?P<key>(?:[a-z]+\.)?[a-z_]+)"
CLAIMS = (  # (pattern, where the value is): each names a key and states its default
    re.compile(rf"`{KEY}` \(default (?:`|\*\*)?(?P<value>[^`*;,)]+)"),  # `key` (default 3)
    re.compile(rf"`{KEY} = (?P<value>[^`]+)`,? \(?(?:the |\(|)default\)?"),  # `key = v` (the default) / , the default
    re.compile(rf"`{KEY} = [^`]+` \((?P<value>[^,)]+), the default"),  # `key = N` (0, the default, ...)
    re.compile(rf"On by default \(`{KEY} = (?P<value>[^`]+)`\)"),
    re.compile(rf"`{KEY}`, (?P<value>on|off) by default"),
    re.compile(rf"`{KEY}` (?:is )?(?P<value>empty) (?:by default|\([^)]*the default\))"),
)
SYNONYMS = {"on": True, "off": False, "empty": None, "a free port": 0}


def full_key(name: str) -> str | None:
    if name in keys():
        return name
    matches = [k for k in keys() if k.split(".", 1)[1] == name]
    return matches[0] if len(matches) == 1 else None


def agrees(dotted: str, stated: str) -> bool:
    section, fld = keys()[dotted]
    value, text = default(dotted), stated.strip().strip('"')
    if text in SYNONYMS:
        return SYNONYMS[text] == value
    if is_duration(SECTIONS[section].model_fields[fld]):
        return value is not None and parse_duration(text.replace(" ", "")) == value
    if isinstance(value, bool):
        return text == str(value).lower()
    if isinstance(value, (int, float)):
        return float(text.split()[0]) == value  # "1024 MB": the number
    return text.replace("<run id>", "{run_id}") == str(value)


def doc_claims() -> list[tuple[str, str, str]]:
    found = []
    for path in DOCS:
        text = " ".join(path.read_text().split())  # a claim may wrap
        for pattern in CLAIMS:
            for m in pattern.finditer(text):
                dotted = full_key(m["key"])
                if dotted is not None:
                    found.append((path.name, dotted, m["value"]))
    return found


def test_the_docs_state_the_schema_defaults() -> None:
    claims = doc_claims()
    assert len(claims) >= 12, claims  # the scanner finds what the docs say
    wrong = [(where, key, stated, default(key)) for where, key, stated in claims if not agrees(key, stated)]
    assert not wrong, wrong


def test_the_readme_prose_states_the_schema_defaults() -> None:
    readme = " ".join((REPO / "README.md").read_text().split())
    aws = re.search(r"Defaults are resctl's \(the AWS ones: (\S+) rendezvous, (\d+) restarts, a (\S+ s) monitor "
                    r"interval", readme)
    assert aws, "the README names resctl's defaults"
    assert aws[1] == default("launch.rdzv_backend") and int(aws[2]) == default("launch.max_restarts")
    assert parse_duration(aws[3].replace(" ", "")) == default("launch.monitor_interval")
    stop = re.search(r"`launch\.workers_stop_timeout`, (\S+ s)\)", readme)
    assert stop and parse_duration(stop[1].replace(" ", "")) == default("launch.workers_stop_timeout")


# --- the memory tier's budget and memory_replicate: the schema, doctor, the docs and the engine ------

def stated_factor(dotted: str, pattern: str) -> int:
    section, fld = keys()[dotted]
    found = re.search(pattern, SECTIONS[section].model_fields[fld].description or "")
    assert found, f"the schema's {dotted} states its /dev/shm need"
    return int(found[1])


def test_the_memory_tier_budget_is_the_schemas() -> None:
    from resctl import slots
    from resctl.doctor import shm  # noqa: F401 - doctor's check reads slots.shm_factor (below)

    tier = stated_factor("checkpoint.memory_every", r"Needs (\d+)x the state per rank in /dev/shm")
    buddy = stated_factor("checkpoint.memory_replicate", r"Needs (\d+)x the state per rank in the buddy's")
    assert (slots.shm_factor(False), slots.shm_factor(True) - slots.shm_factor(False)) == (tier, buddy)
    assert "slots.shm_factor" in (REPO / "resctl" / "doctor" / "shm.py").read_text()
    readme = " ".join((REPO / "README.md").read_text().split())
    assert f"Needs up to {tier}x the per-node state in `/dev/shm`, plus {buddy}x for the buddy copies" in readme
    checkpoint_md = " ".join((REPO / "docs" / "checkpoint.md").read_text().split())
    assert f"up to {tier}x the per-node state in `/dev/shm`" in checkpoint_md
    assert f"Budget: {buddy}x (`slots.BUDDY_COPIES`) the state of each rank of the other" in checkpoint_md


def test_memory_replicate_defaults_to_the_schemas_in_the_engine() -> None:
    from resctl.checkpoint import settings

    assert settings.build(dir="/tmp/x").memory_replicate == default("checkpoint.memory_replicate")
