"""`resctl store` (issue 42): where it listens, and its usage errors (exit 2, one line, no traceback);
`launch.store = "external"`'s profile rules and what the plan gives the launcher."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from resctl.errors import ProfileError, UsageError
from resctl.launch.store_server import DEFAULT_PORT, Listen, bind, parse_listen
from resctl.profile.load import resolve


@pytest.mark.parametrize("text,want", [
    ("0.0.0.0:29400", Listen("0.0.0.0", 29400)), (":29401", Listen("0.0.0.0", 29401)),
    ("127.0.0.1", Listen("127.0.0.1", DEFAULT_PORT)), ("[::1]:29402", Listen("::1", 29402)),
    ("localhost:29403", None),
])
def test_listen_addresses(text: str, want: Listen | None) -> None:
    got = parse_listen(text)
    assert got == want if want else got.port == 29403 and got.host in ("127.0.0.1", "::1")


@pytest.mark.parametrize("text", ["h:0", "h:70000", "h:port", "::1:5", "[::1", "no-such-host.invalid:5"])
def test_bad_listen_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match="--listen"):
        parse_listen(text)


def test_taken_port_and_foreign_address_are_usage_errors() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    with pytest.raises(UsageError, match="is in use"):
        bind(Listen("127.0.0.1", port))
    with pytest.raises(UsageError, match="not an address of this machine"):
        bind(Listen("192.0.2.1", port))  # TEST-NET-1: never this machine's
    proc = subprocess.run([sys.executable, "-m", "resctl", "store", "--listen", f"127.0.0.1:{port}"],
                          capture_output=True, text=True, timeout=60)
    taken.close()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"port {port} is in use" in proc.stderr


def test_help_has_an_example() -> None:
    out = subprocess.run([sys.executable, "-m", "resctl", "store", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "resctl store --listen 0.0.0.0:29500" in out.stdout and "launch.store=external" in out.stdout


def _launch(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    (tmp_path / "p.toml").write_text("[launch]\n" + text)
    return resolve(tmp_path / "p.toml", env={}).profile.launch


@pytest.mark.parametrize("text,why", [
    ('store = "external"\n', "set launch.rdzv_endpoint"),
    ('store = "external"\nrdzv_endpoint = "h:29500"\nrdzv_conf = {is_host = "1"}\n', "is_host = 1"),
    ('store = "external"\nrdzv_endpoint = "h:29500"\npreflight = "cluster"\n', "preflight"),
    ('store = "external"\nstandalone = true\n', "standalone"),
])
def test_external_store_rules(tmp_path: Path, text: str, why: str) -> None:
    with pytest.raises(ProfileError, match=why):
        _launch(tmp_path, text)


def test_plan_makes_every_node_a_client(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    out = subprocess.run([sys.executable, "-m", "resctl", "run", "--nnodes", "2:3", "--rdzv-endpoint", "h:29500",
                          "--rdzv-id", "x", "--set", "launch.store=external", "--dry-run", str(script)],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "--rdzv-conf is_host=0" in out.stdout + out.stderr and "RESCTL_RDZV_STORE=external" in out.stdout + out.stderr
