"""Resolve a profile from its layers and remember where every value came from.

Precedence, lowest to highest (a higher layer never loses to a lower one):

1. built-in defaults (the schema),
2. the profile file (`-p FILE`, else `RESCTL_PROFILE`, else `resctl.toml` in the working directory when
   present, announced on stderr, and refused when another user owns it or anyone may write it),
3. `RESCTL_<SECTION>_<KEY>` environment variables (and `RESCTL_FAULTS`),
4. command-line flags (`--nproc-per-node 8`, ...),
5. `--set section.key=value` overrides, in the order given.

Every problem in every layer is collected into one `ProfileError` naming the source, the key,
the value and the fix.
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from pydantic import ValidationError

from resctl.drills import parse_schedule  # the drill registry: imports nothing
from resctl.errors import Problem, ProfileError
from resctl.profile import contract
from resctl.profile.schema import ENV_PREFIX, SECTIONS, Profile, env_name, is_duration, key_name, keys
from resctl.redact import redact_rdzv_conf, redact_value

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_FILE = "resctl.toml"
DEFAULT_SOURCE = "default"
# RESCTL_* variables that are not profile keys: resctl's own switches and the plan it hands workers.
RESERVED_ENV = {contract.DEBUG, contract.PROFILE, contract.FAULTS, contract.PLAN, contract.RUN_DIR, contract.PRELOAD}


@dataclass
class Layer:
    """Flat `section.key -> value` pairs from one source."""

    source: str
    values: dict[str, Any] = field(default_factory=dict)
    # source label per key when it differs from `source` (env var names, flag names)
    labels: dict[str, str] = field(default_factory=dict)

    def label(self, dotted: str) -> str:
        return self.labels.get(dotted, self.source)


@dataclass
class Resolved:
    profile: Profile
    sources: dict[str, str]
    file: Path | None
    how: str = ""  # how the file was chosen: "-p", "env RESCTL_PROFILE", "working directory"

    def loaded(self) -> str:
        """One line saying which profile file was loaded, for stderr."""
        if self.file is None:
            return "resctl: no profile file: built-in defaults (-p FILE to use one)"
        where = {"-p": "from -p", "working directory": "found in the working directory; -p FILE to choose another"}
        return f"resctl: profile {self.file.resolve()} ({where.get(self.how, 'from ' + self.how)})"

    def source(self, dotted: str) -> str:
        return self.sources.get(dotted, DEFAULT_SOURCE)


def _suggest(name: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def _unknown_key(source: str, dotted: str, value: Any = None) -> Problem:
    value = redact_value(dotted, value)
    section = dotted.split(".", 1)[0]
    if section not in SECTIONS:
        hint = _suggest(section, list(SECTIONS))
        return Problem(
            source, dotted, f"unknown section [{section}]", value,
            (hint + " " if hint else "") + f"sections are: {', '.join(SECTIONS)}",
        )
    hint = _suggest(dotted, list(keys()))
    return Problem(
        source, dotted, "unknown key", value,
        (hint + " " if hint else "") + f"run `resctl profile init` to see every key of [{section}]",
    )


def parse_value(text: str) -> Any:
    """A TOML value (`8`, `true`, `"x"`, `[1, 2]`, `{a = 1}`); anything else is kept as a plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text  # too deeply nested for TOML: as a string, the schema refuses it with the key named


def file_layer(path: Path) -> tuple[Layer, list[Problem]]:
    label = str(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Layer(label), [Problem(label, "", "profile file not found", fix="check the path given to -p/--profile")]
    except (OSError, UnicodeDecodeError) as err:
        return Layer(label), [Problem(label, "", f"cannot read the profile: {err}")]
    except tomllib.TOMLDecodeError as err:
        return Layer(label), [Problem(label, "", f"not valid TOML: {err}", fix="fix the syntax at the line and column shown")]
    except RecursionError:
        return Layer(label), [Problem(label, "", "nested too deeply to read (arrays or tables inside each other "
                                      "hundreds of levels deep)", fix="no resctl key takes nested values; remove them")]
    layer, problems = Layer(label), []
    known = keys()
    for section, table in data.items():
        if not isinstance(table, dict):
            problems.append(_unknown_key(label, section, table) if section not in SECTIONS else Problem(
                label, section, "must be a table", table, fix=f"write it as a [{section}] section"))
            continue
        for key, value in table.items():
            dotted = f"{section}.{key}"
            if dotted in known:
                layer.values[dotted] = value
            else:
                problems.append(_unknown_key(label, dotted, value))
    return layer, problems


def env_layer(env: Mapping[str, str]) -> tuple[Layer, list[Problem]]:
    layer, problems = Layer("environment"), []
    by_env = {env_name(dotted): dotted for dotted in keys()}
    section_prefixes = tuple(f"{ENV_PREFIX}{s.upper()}_" for s in SECTIONS)
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX) or name in RESERVED_ENV:
            continue
        dotted = by_env.get(name)
        if dotted is None:
            if name.startswith(section_prefixes):
                hint = _suggest(name, list(by_env))
                problems.append(Problem(f"env {name}", "", "not a resctl setting", raw,
                                        (hint + " " if hint else "") + "unset it or correct the name"))
            continue
        layer.values[dotted] = parse_env_value(dotted, raw)
        layer.labels[dotted] = f"env {name}"
    if env.get(contract.FAULTS):
        try:
            layer.values["faults.schedule"] = parse_schedule(env[contract.FAULTS])
            layer.labels["faults.schedule"] = "env RESCTL_FAULTS"
        except ValueError as err:
            problems.append(Problem(f"env {contract.FAULTS}", "faults.schedule", str(err), env[contract.FAULTS],
                                    "use KIND@STEP[:RANK],... e.g. sigkill@30:1,exception@50"))
    return layer, problems


def parse_env_value(dotted: str, raw: str) -> Any:
    section, fld = keys()[dotted]
    annotation = str(SECTIONS[section].model_fields[fld].annotation)
    # Strings stay strings ("8" for nproc_per_node); structured values are TOML.
    if "dict" in annotation or "list" in annotation:
        return parse_value(raw)
    return raw


def set_layer(assignments: Sequence[str]) -> tuple[Layer, list[Problem]]:
    layer, problems = Layer("--set"), []
    known = keys()
    for item in assignments:
        dotted, sep, text = item.partition("=")
        dotted = dotted.strip()
        if not sep or "." not in dotted:
            problems.append(Problem("--set", dotted, "expected SECTION.KEY=VALUE", item,
                                    "e.g. --set heartbeat.timeout=15m"))
            continue
        if dotted not in known:
            problems.append(_unknown_key("--set", dotted, text))
            continue
        layer.values[dotted] = parse_value(text.strip())
        layer.labels[dotted] = f"--set {dotted}"
    return layer, problems


def find_file(explicit: str | os.PathLike[str] | None, cwd: Path, env: Mapping[str, str]) -> tuple[Path | None, str]:
    """The profile file to load and how it was chosen: "-p", "env RESCTL_PROFILE" or "working directory"."""
    if explicit:
        return Path(explicit), "-p"
    if env.get(contract.PROFILE):
        return Path(env[contract.PROFILE]), f"env {contract.PROFILE}"
    candidate = cwd / DEFAULT_FILE
    return (candidate, "working directory") if candidate.is_file() else (None, "")


def untrusted(path: Path) -> str:
    """Why a working directory's resctl.toml must not be loaded unasked ("" when it may be).

    A profile can run code in the launcher (launch.env.PYTHONPATH, LD_PRELOAD): one that another user
    could have written, in a shared or world-writable directory such as /tmp, is refused as git
    refuses a repository owned by someone else. Naming it with -p loads it anyway.
    """
    try:
        info = path.stat()
    except OSError:
        return ""
    if info.st_uid not in (os.geteuid(), 0):
        return f"it is owned by another user (uid {info.st_uid})"
    if info.st_mode & 0o002:
        return "anyone on this machine can write it"
    return ""


def resolve(
    file: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Layer | None = None,
    sets: Sequence[str] = (),
    cwd: Path | None = None,
    use_env: bool = True,
) -> Resolved:
    """Merge the layers into a validated Profile, or raise ProfileError listing every problem."""
    env = os.environ if env is None else env
    cwd = cwd or Path.cwd()
    path, how = find_file(file, cwd, env)
    layers: list[Layer] = []
    problems: list[Problem] = []
    why_not = untrusted(path) if path is not None and how == "working directory" else ""
    if why_not:
        problems.append(Problem(str(path), "", f"not loaded from the working directory: {why_not}",
                                fix=f"pass -p {path} if you trust it, or remove it"))
    elif path is not None:
        layer, found = file_layer(path)
        layers.append(layer)
        problems += found
    if use_env:
        layer, found = env_layer(env)
        layers.append(layer)
        problems += found
    if flags is not None:
        layers.append(flags)
    layer, found = set_layer(sets)
    layers.append(layer)
    problems += found

    merged, sources = _merge(layers)
    nested: dict[str, dict[str, Any]] = {}
    for dotted, value in merged.items():
        section, key = dotted.split(".", 1)
        nested.setdefault(section, {})[key] = value
    profile, partial, found = _validate(nested, merged, sources)
    problems += found
    if problems:
        raise ProfileError(problems, partial=partial)
    assert profile is not None
    return Resolved(profile, sources, path, how)


def _validate(nested: dict[str, dict[str, Any]], merged: Mapping[str, Any], sources: Mapping[str, str]
              ) -> tuple[Profile | None, Profile | None, list[Problem]]:
    """(profile, partial, problems). Pydantic runs the checks across keys only once every key is
    valid; so with field errors the profile is validated again without the bad keys (their
    defaults instead), and the rules across keys that fail there are reported too: every problem
    in one pass. `partial` is that profile (None when even it is invalid), for checks beyond the
    schema (`profile.grace`)."""
    try:
        return Profile.model_validate(nested), None, []
    except ValidationError as err:
        errors = err.errors()
    problems = [_problem(e, merged, sources) for e in errors]
    bad = {(str(e["loc"][0]), str(e["loc"][1])) for e in errors if len(e["loc"]) >= 2}
    trimmed = {section: {k: v for k, v in values.items() if (section, k) not in bad} for section, values in nested.items()}
    across = [e for e in errors if len(e["loc"]) < 2]
    if bad:
        try:
            return None, Profile.model_validate(trimmed), problems
        except ValidationError as again:
            across = [e for e in again.errors() if len(e["loc"]) < 2]
        problems += [p for p in (_problem(e, merged, sources) for e in across) if p not in problems]
    # and once more without the sections whose rules failed, for the checks beyond the schema
    failed = {str(e["loc"][0]) for e in across if e["loc"]}
    try:
        partial = Profile.model_validate({k: v for k, v in trimmed.items() if k not in failed}) if failed else None
    except ValidationError:
        partial = None
    return None, partial, problems


def _merge(layers: Sequence[Layer]) -> tuple[dict[str, Any], dict[str, str]]:
    """Flat values and their sources, higher layers winning. Tables merge name by name (RESCTL_LAUNCH_ENV adds
    to the profile's [launch.env] rather than replacing it); the source then lists every layer that took part."""
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for layer in layers:
        for dotted, value in layer.values.items():
            below = merged.get(dotted)
            if isinstance(below, dict) and isinstance(value, dict) and _is_table(dotted):
                merged[dotted] = {**below, **value}
                sources[dotted] = f"{sources[dotted]} + {layer.label(dotted)}"
            else:
                merged[dotted] = value
                sources[dotted] = layer.label(dotted)
    return merged, sources


def _is_table(dotted: str) -> bool:
    section, fld = keys()[dotted]
    return str(SECTIONS[section].model_fields[fld].annotation).startswith(("dict", "typing.Annotated[dict"))


def _problem(error: Mapping[str, Any], merged: Mapping[str, Any], sources: Mapping[str, str]) -> Problem:
    loc = [str(part) for part in error["loc"]]
    message = str(error["msg"]).removeprefix("Value error, ")
    if len(loc) >= 2 and loc[0] in SECTIONS:
        section = loc[0]
        model = SECTIONS[section]
        fld = loc[1]
        dotted = f"{section}.{key_name(section, fld) if fld in model.model_fields else fld}"
        if len(loc) > 2:
            dotted += "[" + "].[".join(loc[2:]) + "]"
        base = f"{section}.{key_name(section, fld)}" if fld in model.model_fields else dotted
        shown = merged.get(base, error.get("input"))
        # Error messages are output too: no secret values in them.
        shown = redact_rdzv_conf(shown) if base == "launch.rdzv_conf" and isinstance(shown, dict) \
            else redact_value(base, shown)
        return Problem(sources.get(base, DEFAULT_SOURCE), dotted, message, shown, _fix(section, fld, error))
    # A check across keys (a model validator): name every key that took part and its source.
    section = loc[0] if loc else ""
    involved = sorted({src for dotted, src in sources.items() if not section or dotted.startswith(section + ".")})
    return Problem(", ".join(involved) or DEFAULT_SOURCE, section or "profile", message,
                   fix="change the values so the rule above holds")


def _fix(section: str, fld: str, error: Mapping[str, Any]) -> str:
    model = SECTIONS[section]
    info = model.model_fields.get(fld)
    if info is None:
        return ""
    if is_duration(info):
        return "use a number of seconds or a duration such as 250ms, 90s, 15m, 24h"
    default = info.get_default(call_default_factory=True)
    return f"{info.description} Default: {default!r}." if info.description else ""
