"""Text generated from the schema: the starter profile and the README's profile reference."""

from __future__ import annotations

from typing import Any

from resctl.profile.schema import SECTIONS, Profile, env_name, is_duration, key_name
from resctl.profile.units import format_duration


def show_value(section: str, fld: str, value: Any) -> str:
    info = SECTIONS[section].model_fields[fld]
    if is_duration(info):
        return "none" if value is None else format_duration(float(value))
    if section == "heartbeat" and fld == "sections":
        return ", ".join(f"{k}={format_duration(v)}" for k, v in value.items()) or "{}"
    if isinstance(value, list):
        return ", ".join(f"{v.kind}@{v.step}:{v.rank}" if hasattr(v, "kind") else str(v) for v in value) or "[]"
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def default_text(dotted: str) -> str:
    """The schema's default of `section.key` as every place shows it ("" when unset)."""
    section, _, key = dotted.partition(".")
    fld = next(f for f in SECTIONS[section].model_fields if key_name(section, f) == key)
    return show_value(section, fld, getattr(getattr(Profile(), section), fld))


def _toml(section: str, fld: str, value: Any) -> str:
    info = SECTIONS[section].model_fields[fld]
    if is_duration(info):
        return '"none"' if value is None else f'"{format_duration(float(value))}"'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"{value:g}" if isinstance(value, float) else str(value)
    if isinstance(value, dict):
        return "{}" if not value else "{ " + ", ".join(f'{k} = "{v}"' for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[]"
    return f'"{value}"'


def starter_toml() -> str:
    """Every key at its default, commented out (`#key = value`, valid TOML once the `#` goes), under
    its documentation (`# text`); a key unset by default is only documented."""
    defaults = Profile()
    lines = ["# resctl profile. Precedence: defaults < this file < RESCTL_* env < flags < --set.",
             "# Durations take units: 250ms, 90s, 15m, 24h (a bare number is seconds).", ""]
    for section, model in SECTIONS.items():
        lines.append(f"[{section}]")
        lines.append(f"# {(model.__doc__ or '').strip().splitlines()[0]}")
        for fld, info in model.model_fields.items():
            value = getattr(getattr(defaults, section), fld)
            lines.append(f"# {info.description or ''}")
            if value is None:  # TOML has no null: a note, not a line that breaks once uncommented
                lines.append(f"# {key_name(section, fld)}: unset by default (set it to give it a value)")
            else:
                lines.append(f"#{key_name(section, fld)} = {_toml(section, fld, value)}")
        lines.append("")
    return "\n".join(lines)


def reference_markdown() -> str:
    """The profile reference table for the README."""
    defaults = Profile()
    out = []
    for section, model in SECTIONS.items():
        out.append(f"### [{section}]\n\n{(model.__doc__ or '').strip().splitlines()[0]}\n")
        out.append("| key | default | env | description |\n|---|---|---|---|")
        for fld, info in model.model_fields.items():
            dotted = f"{section}.{key_name(section, fld)}"
            value = getattr(getattr(defaults, section), fld)
            shown = show_value(section, fld, value) or "(unset)"
            out.append(f"| `{key_name(section, fld)}` | `{shown}` | `{env_name(dotted)}` | {info.description or ''} |")
        out.append("")
    return "\n".join(out)


START, END = "<!-- profile-reference:start -->", "<!-- profile-reference:end -->"


def update_readme(path: str = "README.md") -> None:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"{head}{START}\n{reference_markdown()}\n{END}{tail}")


if __name__ == "__main__":
    update_readme()
