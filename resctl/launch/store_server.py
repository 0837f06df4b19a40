"""`resctl store`: the job's rendezvous store as a process that is no training node's (issue 42).

With `launch.store = "node"` (the default, torchrun's and NVRx's way) the c10d TCPStore that every
launcher rendezvouses through, and that the workers bootstrap their process group from
(TORCHELASTIC_USE_AGENT_STORE, `resctl.launch.agent`), lives inside the launcher of the node with
`is_host`: that node lost, the store goes with it and every other node fails. With
`launch.store = "external"` every `resctl run` connects as a client (`is_host=0` everywhere, set by the
plan) to the store this module serves on a machine that does not train (Kubernetes: a Deployment and a
Service of its own; Slurm: the batch step). Any training node may then be lost: a restart round.

The server is torch's own TCPStore server (the one the launcher would have hosted), on a socket bound
here, so that the address given is the only one it listens on and a port in use or an address that is
not this machine's is a usage error (exit 2) before anything starts. It keeps every key in memory: a
lost store process is a lost rendezvous (`docs/recovery.md`: the launchers stop the job with
`EXIT_STORE_LOST`).
"""

from __future__ import annotations

import errno
import ipaddress
import signal
import socket
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from resctl.errors import UsageError

#: The port the store listens on when none is given: the profile's default rendezvous port.
DEFAULT_PORT = 29500
#: How many connections may wait to be accepted (every launcher opens two, every worker one per round).
BACKLOG = 4096


@dataclass(frozen=True)
class Listen:
    """Where the store listens: an address of this machine (0.0.0.0 / :: for every interface) and a port."""

    host: str
    port: int

    @property
    def family(self) -> int:
        return socket.AF_INET6 if ":" in self.host else socket.AF_INET

    @property
    def endpoint(self) -> str:
        """HOST:PORT as a node's `--rdzv-endpoint` would name this machine (a wildcard: its host name)."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::") else self.host
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """"HOST:PORT", "[IPV6]:PORT", "HOST" or ":PORT" (every interface) -> Listen; UsageError when it is none."""
    text = text.strip()
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ("" if not rest else "x")
        if not sep:
            raise UsageError(f"--listen {text!r}: an IPv6 address is written [ADDR]:PORT")
    elif text.count(":") > 1:
        raise UsageError(f"--listen {text!r}: write an IPv6 address in brackets, e.g. [::1]:{DEFAULT_PORT}")
    else:
        host, _, port_text = text.partition(":")
    port = DEFAULT_PORT
    if port_text:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise UsageError(f"--listen {text!r}: the port must be a number from 1 to 65535, e.g. 0.0.0.0:{DEFAULT_PORT}")
        port = int(port_text)
    return Listen(_address(host or "0.0.0.0", text), port)


def _address(host: str, given: str) -> str:
    """The numeric address of `host` (a name resolves to its first address)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (socket.gaierror, UnicodeError, IndexError) as err:
        raise UsageError(f"--listen {given!r}: {host!r} does not resolve ({err}); give an address of this "
                         "machine, or 0.0.0.0 for every interface") from None


def bind(listen: Listen) -> socket.socket:
    """A listening socket on `listen`; UsageError when the port is taken or the address is not this machine's."""
    sock = socket.socket(listen.family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restarted store takes its port back at once
        sock.bind((listen.host, listen.port))
        sock.listen(BACKLOG)
    except OSError as err:
        sock.close()
        where = f"{listen.host}:{listen.port}"
        if err.errno == errno.EADDRINUSE:
            raise UsageError(f"--listen {where}: port {listen.port} is in use (another store or launcher?); "
                             "stop it or pick another port") from None
        if err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            raise UsageError(f"--listen {where}: {listen.host} is not an address of this machine; give one of its "
                             "addresses, or 0.0.0.0 for every interface") from None
        if err.errno == errno.EACCES:
            raise UsageError(f"--listen {where}: not allowed to listen on port {listen.port}; use a port above 1023") from None
        raise UsageError(f"--listen {where}: cannot listen there: {err.strerror}") from None
    return sock


def serve(listen: Listen, on_ready: Callable[[Listen], None], stop: threading.Event | None = None) -> None:
    """Serve the store on `listen` until SIGTERM/SIGINT (or `stop` is set); the keys die with the process."""
    stop = stop or threading.Event()
    sock = bind(listen)  # before torch's import: a bad address or a taken port is said at once
    import torch.distributed as dist

    client_host = "127.0.0.1" if listen.host == "0.0.0.0" else "::1" if listen.host == "::" else listen.host
    try:
        store: Any = dist.TCPStore(client_host, listen.port, None, True, timeout=timedelta(seconds=30),
                                   wait_for_workers=False, master_listen_fd=sock.fileno())
    except Exception:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor now (and closes it)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        on_ready(listen)
        stop.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        del store
