"""`resctl profile validate` refuses exactly what `resctl run` refuses (issue 12, "validation differs from the run")."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.inproc import invoke

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "examples" / "train_snapshot.py")

# (profile text, key the message must name, words of the fix or reason)
BAD = [
    ("[heartbeat]\ntimeout = nan\n", "heartbeat.timeout", "finite"),
    ("[heartbeat]\ntimeout = inf\n", "heartbeat.timeout", "finite"),
    ("[launch]\nmonitor_interval = inf\n", "launch.monitor_interval", "finite"),
    ('[launch]\nmonitor_interval = "1e999s"\n', "launch.monitor_interval", "finite"),
    ("[heartbeat]\nsafety_factor = nan\n", "heartbeat.safety_factor", "finite"),
    ("[doctor]\nmin_storage_gbps = inf\n", "doctor.min_storage_gbps", "finite"),
    ('[heartbeat.sections]\ncheckpoint = nan\n', "heartbeat.sections", "finite"),
    ('[launch]\nredirects = "banana"\n', "launch.redirects", "per local rank"),
    ('[launch]\ntee = 7\n', "launch.tee", "per local rank"),
    ('[launch]\nnnodes = "5:2"\n', "launch.nnodes", "MIN <= MAX"),
    ('[launch]\nnnodes = "two"\n', "launch.nnodes", "MIN:MAX"),
    ('[launch]\nnproc_per_node = "lots"\n', "launch.nproc_per_node", "auto, cpu, gpu"),
    ("[launch]\nrdzv_port = 99999\n", "launch.rdzv_port", "65535"),
    ('[launch]\nrdzv_endpoint = "head:99999"\n', "launch.rdzv_endpoint", "0 to 65535"),
    ('[launch]\nnvrx_version = "banana"\n', "launch.nvrx_version", "0.4.1"),
    ('[launch]\nnvrx_version = "0.5.0"\n', "launch.nvrx_version", "not supported"),
    ('[launch]\nnvrx_version = "0.7.0"\nrestart_policy = "min-healthy"\n', "launch", "removed in 0.6"),
    ('[launch]\nrestart_policy = "min-healthy"\n', "min-healthy", "removed in 0.6"),  # installed 0.4.1: ok
    ('[launch]\nstandalone = true\nrdzv_endpoint = "h:1"\n', "launch", "launch.standalone"),
    ('[launch]\nrdzv_id = "../../etc"\n', "launch.rdzv_id", "run id names a directory"),
    ('[launch.rdzv_conf]\njoin_timeout = "1,x=2"\n', "launch.rdzv_conf", "','"),
    ('[launch.env]\n"A=B" = "x"\n', "launch.env", "'='"),
    ('[launch.env]\nA = "x\\u0000y"\n', "launch.env", "NUL"),
    ('[launch]\nrun_dir = "a\\u0000b"\n', "launch.run_dir", "NUL"),
    ('[launch]\nlog_dir = "/proc/x"\n', "launch.log_dir", "pseudo-filesystem"),
    ('[launch]\nrun_dir = ""\n', "launch.run_dir", "cannot be empty"),
    ('[launch]\nlog_dir = "  "\n', "launch.log_dir", "only spaces"),
    ('[checkpoint]\ndir = "/sys/fs/x"\n', "checkpoint.dir", "pseudo-filesystem"),
    ("[launch]\nx = " + "[" * 3000 + "]" * 3000 + "\n", "p.toml", "nested too deeply"),
]


@pytest.mark.parametrize("text,key,words", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
def test_validate_and_run_refuse_the_same(tmp_path: Path, text: str, key: str, words: str) -> None:
    (tmp_path / "p.toml").write_text(text)
    results = {
        "validate": invoke(["profile", "validate", "p.toml"], cwd=tmp_path),
        "run": invoke(["run", "-p", "p.toml", "--dry-run", SCRIPT], cwd=tmp_path),
    }
    for name, r in results.items():
        if text.startswith('[launch]\nrestart_policy = "min-healthy"'):  # NVRx 0.4.1 is installed: both accept it
            assert r.code == 0, (name, r.text, r.crash)
            continue
        assert not r.crash, (name, r.crash)
        assert r.code == 2, (name, r.text)
        assert "Traceback" not in r.text and key in r.err and words in r.err, (name, r.err)


def test_validate_accepts_what_run_accepts(tmp_path: Path) -> None:
    for profile in sorted((REPO / "examples" / "profiles").glob("*.toml")):
        r = invoke(["profile", "validate", str(profile)], cwd=tmp_path)
        assert r.code == 0 and not r.crash, (profile, r.text)
    (tmp_path / "p.toml").write_text('[launch]\nnnodes = "2:4"\nredirects = "0:3,1:2"\nnproc_per_node = 8\n'
                                     'rdzv_endpoint = "[fd00::1]:29400"\nrdzv_id = "job-1.a_b"\nnvrx_version = "0.7.0"\n')
    assert invoke(["profile", "validate", "p.toml"], cwd=tmp_path).code == 0


def _float_keys() -> list[str]:
    from resctl.profile.schema import SECTIONS, key_name

    return [f"{section}.{key_name(section, name)}" for section, model in SECTIONS.items()
            for name, info in model.model_fields.items() if "float" in str(info.annotation)]


@pytest.mark.parametrize("key", _float_keys())
@pytest.mark.parametrize("value", ["nan", "inf", "-inf", '"nan"', '"inf"', '"1e999"'])
def test_no_number_in_the_schema_may_be_non_finite(key: str, value: str) -> None:
    from resctl.errors import ProfileError
    from resctl.profile.load import resolve

    with pytest.raises(ProfileError) as err:
        resolve(None, env={}, sets=[f"{key}={value}"], cwd=Path("/nonexistent"))
    assert key in str(err.value)
