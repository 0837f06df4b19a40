"""Hostile input, generated: profiles, --set overrides and RESCTL_* variables only ever give exit 0 or 2, never a
traceback (issue 12). In-process (tests/cli/inproc.py), `--dry-run` only: nothing is started.

RESCTL_FUZZ_EXAMPLES raises the example count for a longer local hunt (CI: 250 per test).
"""

from __future__ import annotations

import json
import os
import string
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from resctl.profile.schema import SECTIONS, env_name, keys
from tests.cli.inproc import invoke

SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_snapshot.py")
EXAMPLES = int(os.environ.get("RESCTL_FUZZ_EXAMPLES", "250"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEYS = sorted(keys())
TRICKY_TEXT = ["", " ", "auto", "none", "nan", "inf", "-inf", "1e999", "-1", "0", "5:2", "2:4", "0:0", "99999",
               "host:99999", "[::1]:1", "::1", "/proc/x", "/sys", "../../etc", "a=b", "a,b", "\x00", "\u2028",
               "10ms", "1e3d", "9" * 40, "${HOME}", "{run_id}", "0.4.1", "0.5.0", "v1", "banana", "\t\n", "é",
               "\udcff"]  # an undecodable byte, as os.environ holds it


# Values a key may well accept, so that many examples get past validation into the plan.
PLAUSIBLE = ["1", "2", "8", "0", "true", "false", "0.5", '"auto"', '"90s"', '"15m"', '"none"', '"2:4"', '"1"', '"3"',
             '"fork"', '"exec"', '"spawn"', '"any-failed"', '"127.0.0.1"', '"0.7.0"', '"0.4.1"', '"host:29400"',
             '{A = "1"}', '{HF_TOKEN = "hf_x"}', '{checkpoint = "30m"}', "[]", '"x"', '"SIGTERM"', '"device"']


def text() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(TRICKY_TEXT), st.text(max_size=20),
                     st.text(alphabet=string.printable, max_size=12))


def scalars() -> st.SearchStrategy[Any]:
    return st.one_of(st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
                     st.floats(allow_nan=True, allow_infinity=True), text())


def values() -> st.SearchStrategy[Any]:
    return st.recursive(scalars(), lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["a", "B", "A=B", "x y", "kind", "step"]) | text(),
                                                     inner, max_size=3)), max_leaves=6)


def toml_value(value: Any) -> str:
    """A TOML literal (inline tables and arrays), enough for the fuzzer; non-finite floats as TOML spells them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if value != value else ("inf" if value > 0 else "-inf") if value in (float("inf"), float("-inf")) \
            else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)} = {toml_value(v)}" for k, v in value.items()) + "}"


@st.composite
def profiles(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for section in draw(st.lists(st.sampled_from([*SECTIONS, "lanch", "x"]), max_size=3, unique=True)):
        lines.append(f"[{section}]")
        fields = [k.split(".", 1)[1] for k in KEYS if k.startswith(section + ".")] or ["y"]
        for key in draw(st.lists(st.sampled_from([*fields, "unknown"]), max_size=4, unique=True)):
            value = draw(st.one_of(st.sampled_from(PLAUSIBLE), values().map(toml_value)))
            lines.append(f"{json.dumps(key)} = {value}")
    text_ = "\n".join(lines) + "\n"
    if draw(st.booleans()) and text_:  # sometimes damage it
        at = draw(st.integers(0, len(text_)))
        text_ = text_[:at] + draw(st.sampled_from(["[", "]", '"', "=", "\n[[", "\x00", "\udcff", "{"])) + text_[at:]
    return text_


def check(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    r = invoke(args, cwd=cwd, env=env)
    assert not r.crash, f"{args} {env}: escaped main():\n{r.crash}"
    assert r.code in (0, 2), f"{args} {env}: exit {r.code}\n{r.text[-2000:]}"
    assert "Traceback" not in r.text, r.text[-2000:]
    event(f"{args[0]} {args[1] if args[0] == 'profile' else ''} exit {r.code}")


def sets() -> st.SearchStrategy[list[str]]:
    pair = st.tuples(st.sampled_from([*KEYS, "launch.nope", "nosection.x", "noequals"]),
                     st.one_of(st.sampled_from(PLAUSIBLE), values().map(toml_value), text()))
    return st.lists(pair, max_size=3).map(
        lambda pairs: [a for key, value in pairs for a in ("--set", key if key == "noequals" else f"{key}={value}")])


def resctl_env() -> st.SearchStrategy[dict[str, str]]:
    names = [*(env_name(k) for k in KEYS), "RESCTL_FAULTS", "RESCTL_LAUNCH_NOPE", "RESCTL_PROFILE"]
    value = st.one_of(st.sampled_from([p.strip('"') for p in PLAUSIBLE]), values().map(toml_value), text(),
                      text().map(lambda s: s + "\udcff"))  # an undecodable byte, as os.environ holds it
    value = value.map(lambda s: s.replace("\x00", ""))  # an environment cannot hold NUL
    return st.dictionaries(st.sampled_from(names), value, max_size=3)


@FUZZ
@given(profile=st.one_of(st.none(), profiles()), set_args=sets(), env=resctl_env())
def test_fuzzed_profiles_sets_and_variables(profile: str | None, set_args: list[str], env: dict[str, str]) -> None:
    """Every layer at once (file < RESCTL_* < --set), so their merging is fuzzed too."""
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        file_args: list[str] = []
        if profile is not None:
            (cwd / "p.toml").write_text(profile, encoding="utf-8", errors="surrogateescape")
            file_args = ["-p", "p.toml"]
            check(["profile", "validate", "p.toml"], cwd)
        check(["run", *file_args, *set_args, "--dry-run", SCRIPT], cwd, env)
        check(["profile", "show", *file_args, *set_args, "--json"], cwd, env)
