"""Profile layering, provenance, units and error messages."""

from __future__ import annotations

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

from pathlib import Path

import pytest

from resctl.errors import ProfileError
from resctl.profile.load import Layer, resolve
from resctl.profile.render import reference_markdown, starter_toml
from resctl.profile.schema import Profile, keys
from resctl.profile.units import format_duration, parse_duration

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "text,seconds",
    [("90s", 90), ("15m", 900), ("24h", 86400), ("250ms", 0.25), ("1.5d", 129600), (42, 42), ("7", 7), (0.5, 0.5)],
)
def test_durations_accept_units(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["5x", "-3s", "fast", True, [1]])
def test_bad_durations_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_format_duration_round_trips() -> None:
    for seconds in (900, 1200, 5, 0.5, 86400, 90, 1.25):
        assert parse_duration(format_duration(seconds)) == seconds


def test_defaults_are_the_aws_eks_values() -> None:
    hb = Profile().heartbeat
    assert (hb.timeout, hb.initial_timeout) == (900, 1200)
    assert Profile().launch.monitor_interval == 5


def write(tmp_path: Path, text: str, name: str = "p.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_layers_and_sources(tmp_path: Path) -> None:
    path = write(tmp_path, '[launch]\nnproc_per_node = 4\nmax_restarts = 7\n[heartbeat]\ntimeout = "10m"\n')
    flags = Layer("flags", {"launch.max_restarts": 9}, {"launch.max_restarts": "flag --max-restarts"})
    r = resolve(path, env={"RESCTL_LAUNCH_NPROC_PER_NODE": "2", "RESCTL_HEARTBEAT_CHECK_INTERVAL": "2s"},
                flags=flags, sets=["heartbeat.timeout=20m"])
    p = r.profile
    assert p.launch.nproc_per_node == "2" and r.source("launch.nproc_per_node") == "env RESCTL_LAUNCH_NPROC_PER_NODE"
    assert p.launch.max_restarts == 9 and r.source("launch.max_restarts") == "flag --max-restarts"
    assert p.heartbeat.timeout == 1200 and r.source("heartbeat.timeout") == "--set heartbeat.timeout"
    assert p.heartbeat.check_interval == 2
    assert r.source("launch.nnodes") == "default"


def test_resctl_toml_in_cwd_is_picked_up(tmp_path: Path) -> None:
    write(tmp_path, "[launch]\nmax_restarts = 11\n", "resctl.toml")
    r = resolve(None, env={}, cwd=tmp_path)
    assert r.profile.launch.max_restarts == 11 and r.file == tmp_path / "resctl.toml"


def test_unknown_key_suggests_the_right_one(tmp_path: Path) -> None:
    path = write(tmp_path, "[heartbeat]\ntimout = 30\n")
    with pytest.raises(ProfileError) as err:
        resolve(path, env={})
    text = str(err.value)
    assert str(path) in text and "heartbeat.timout" in text and "did you mean 'heartbeat.timeout'" in text


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, '[launch]\nmax_restarts = -1\nmonitor_interval = "soon"\n[lanch]\nx = 1\n')
    with pytest.raises(ProfileError) as err:
        resolve(path, env={"RESCTL_LAUNCH_NNODEZ": "2"})
    problems = err.value.problems
    assert {p.key for p in problems} >= {"launch.max_restarts", "launch.monitor_interval", "lanch.x"}
    assert any("RESCTL_LAUNCH_NNODES" in p.fix for p in problems)
    assert any("did you mean 'launch'" in p.fix for p in problems)


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[launch\nnnodes = 2\n")
    with pytest.raises(ProfileError, match="not valid TOML"):
        resolve(path, env={})


def test_heartbeat_timeout_shorter_than_check_interval_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, '[heartbeat]\ntimeout = "3s"\ncheck_interval = "5s"\n')
    with pytest.raises(ProfileError, match="must be longer than heartbeat.check_interval"):
        resolve(path, env={})


def test_inprocess_timeouts_must_be_ordered(tmp_path: Path) -> None:
    path = write(tmp_path, '[inprocess]\nenabled = true\nsoft_timeout = "2m"\n')
    with pytest.raises(ProfileError, match="soft_timeout < hard_timeout < barrier_timeout"):
        resolve(path, env={})


def test_none_disables_a_heartbeat_timeout(tmp_path: Path) -> None:
    r = resolve(write(tmp_path, '[heartbeat]\ntimeout = "none"\n'), env={})
    assert r.profile.heartbeat.timeout is None


def test_fault_schedule_from_env() -> None:
    r = resolve(None, env={"RESCTL_FAULTS": "sigkill@30:1,exception@50"}, cwd=Path("/nonexistent"))
    assert [(f.kind, f.step, f.rank) for f in r.profile.faults.schedule] == [("sigkill", 30, 1), ("exception", 50, 0)]
    with pytest.raises(ProfileError, match="unknown fault kind"):
        resolve(None, env={"RESCTL_FAULTS": "explode@3"}, cwd=Path("/nonexistent"))


def test_starter_profile_parses_to_the_defaults(tmp_path: Path) -> None:
    text = starter_toml()
    uncommented = "\n".join(
        line[1:] if line[:1] == "#" and line[1:2] not in (" ", "") else line for line in text.splitlines()
    )
    for line in text.splitlines():  # every line a user may uncomment is valid TOML on its own
        if line[:1] == "#" and line[1:2] not in (" ", ""):
            tomllib.loads(line[1:])
    r = resolve(write(tmp_path, uncommented), env={})
    assert r.profile == Profile()
    for dotted in keys():
        assert dotted.split(".")[1] in text


def test_example_profiles_validate() -> None:
    for path in sorted((REPO / "examples" / "profiles").glob("*.toml")):
        resolve(path, env={})


def test_readme_reference_is_generated_from_the_schema() -> None:
    readme = (REPO / "README.md").read_text()
    assert reference_markdown() in readme, "README profile reference is stale: run `python -m resctl.profile.render`"
