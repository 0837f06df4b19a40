"""Every torchrun flag, from one table (resctl.cli.torchrun_flags), checked against the installed torchrun."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resctl.cli import torchrun_flags as tf
from tests.cli.inproc import invoke

REPO = Path(__file__).resolve().parents[2]


def torchrun_options() -> dict[str, tuple[str, ...]]:
    """dest -> option strings of the installed torchrun (help and the positionals left out)."""
    from torch.distributed.run import get_args_parser

    return {a.dest: tuple(a.option_strings) for a in get_args_parser()._actions
            if a.option_strings and a.dest != "help"}


def resctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "resctl", "run", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, timeout=60)


def test_the_table_has_every_torchrun_flag_with_all_its_names() -> None:
    installed = torchrun_options()
    missing = sorted(set(installed) - set(tf.TORCHRUN_DESTS))
    assert not missing, f"torchrun flags resctl run does not know (add them to FLAGS): {missing}"
    for dest, names in installed.items():
        assert set(names) <= set(tf.BY_DEST[dest].names), (dest, names)
    # (Rows for flags an older torch lacks are fine: the GPU machine runs torch 2.11.)


def test_profile_keys_of_the_table_are_in_the_schema() -> None:
    from resctl.profile.schema import Profile

    fields = {f"{section}.{key}" for section, model in Profile.model_fields.items()
              for key in (model.annotation.model_fields if hasattr(model.annotation, "model_fields") else {})}
    for flag in tf.FLAGS:
        if flag.to in ("profile", "resctl"):
            assert flag.key in fields, flag


def _sample(flag: tf.Flag) -> list[str]:
    samples = {"nnodes": "1", "nproc_per_node": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "auto",
               "rdzv_conf": "timeout=60", "monitor_interval": "1", "start_method": "spawn", "event_log_handler": "null",
               "redirects": "3", "tee": "1", "local_ranks_filter": "0", "master_port": "29511", "master_addr": "127.0.0.1",
               "logs_specs": "default", "numa_binding": "node", "signals_to_handle": "SIGTERM"}
    if flag.type is bool:
        return [flag.shown]
    value = samples.get(flag.dest, "3" if flag.type is int else "x")
    return [flag.shown, value]


@pytest.mark.parametrize("dest", sorted(torchrun_options()))
def test_every_torchrun_flag_is_accepted(tmp_path: Path, dest: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    flag = tf.BY_DEST[dest]
    for name in torchrun_options()[dest]:  # every spelling torchrun takes; in-process (the CLI's own test runs one)
        out = invoke(["run", name, *_sample(flag)[1:], "--dry-run", "train.py"], cwd=tmp_path)
        assert not out.crash and "No such option" not in out.err, out.err + out.crash
        if flag.to == "refused" and _sample(flag)[1:] != [flag.noop]:  # parsed, and refused with the reason (nothing silently ignored)
            assert out.code == 2 and "is not supported" in out.err
        else:
            assert out.code == 0, out.err
    if flag.to == "launcher":
        assert f"{flag.shown} {_sample(flag)[1]}" in out.out, "passed to ft_launcher as typed"


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_bad_nproc_per_node_exits_2_at_once(tmp_path: Path, value: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    t0 = time.monotonic()
    out = resctl("--nproc-per-node", value, "train.py", cwd=tmp_path)
    assert out.returncode == 2 and "--nproc-per-node" in out.stderr and "Traceback" not in out.stderr
    assert time.monotonic() - t0 < 20 and not (tmp_path / "resctl-runs").exists(), "nothing was started"


@pytest.mark.parametrize("args", [["--nnodes", "2:1"], ["--nnodes", "zero"], ["--start-method", "thread"],
                                  ["--master-port", "70000"], ["--max-restarts", "-1"]])
def test_other_bad_values_exit_2(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = resctl(*args, "train.py", cwd=tmp_path)
    assert out.returncode == 2 and args[0] in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_a_typed_start_method_reaches_the_launcher(tmp_path: Path, method: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = resctl("--start-method", method, "--dry-run", "train.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    command = next(line for line in out.stdout.splitlines() if "resctl.launch.ft_entry" in line)
    assert f"--start-method {method}" in command
    assert ("--run-path" in command) == (method == "fork"), "spawn/forkserver: each worker a new interpreter"
    assert "flag --start-method" in out.stdout


def test_layer_maps_flags_to_profile_keys() -> None:
    keys, labels = tf.layer(tf.given({"nproc_per_node": "4", "rdzv_conf": "a=1,b=2", "shutdown_timeout": 30,
                                      "standalone": True, "role": "r"}))
    assert keys == {"launch.nproc_per_node": "4", "launch.rdzv_conf": {"a": "1", "b": "2"},
                    "launch.term_timeout": 30, "launch.standalone": True}
    assert labels["launch.term_timeout"] == "flag --shutdown-timeout"
    assert tf.launcher_args(tf.given({"role": "trainer", "local_ranks_filter": "0"})) == \
        ["--role", "trainer", "--local-ranks-filter", "0"]
