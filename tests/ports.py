"""Ports for the tests' own servers (rendezvous, preflight stores, torchrun's --master-port, slurmd):
picked outside the kernel's ephemeral range, free when picked.

A port the OS picks (bind to port 0) comes from the ephemeral range, and so do the ports of every
port-0 server and outgoing connection of the other tests running beside (xdist workers, the TCPStores
and gloo sockets of their jobs). Between the pick and the server's bind, such a port can be taken: CI
saw a Slurm job's preflight store on n1 time out connecting to its own port (45 s) while the rest of
the suite ran. Below the ephemeral range only another explicit pick can collide, one in ~20,000.
"""

from __future__ import annotations

import random
import socket

LOWEST = 10000
_picker = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port free on every IPv4 address now, below the ephemeral range where that range leaves room."""
    top = _ephemeral_low()
    if top - LOWEST >= 1000:
        for _ in range(100):
            port = _picker.randrange(LOWEST, top)
            if _bindable(port):
                return port
    with socket.socket() as s:  # no room below it: the OS picks
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
