"""The store host: one TCPStore server in its own process, so that its memory, connections and CPU
time are its own (as they are in the rank-0 agent or worker that hosts it in a real job).

    python -m bench.scale.host [--legacy]     # prints the port, serves until stdin closes
    python -m bench.scale.host --resctl PORT  # the same, served as `resctl store` serves it (issue 42)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class HostSample:
    rss_peak_mb: float  # VmHWM: the peak resident set of the store process
    rss_mb: float
    connections: int  # peak number of open sockets (the listening one excluded)
    cpu_s: float  # user + system time of the store process over the phase


class StoreHost:
    """A TCPStore server process; `sample()` over a phase: peak RSS, peak connections, CPU time."""

    def __init__(self, libuv: bool = True, resctl_port: int | None = None) -> None:
        args = [sys.executable, "-m", "bench.scale.host"] + ([] if libuv else ["--legacy"])
        args += [] if resctl_port is None else ["--resctl", str(resctl_port)]
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self._peak_conn = 0
        self._cpu0 = self._cpu()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, daemon=True)
        self._sampler.start()

    def _cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS

    def connections(self) -> int:
        n = 0
        for fd in os.scandir(f"/proc/{self.proc.pid}/fd"):
            try:
                if os.readlink(fd.path).startswith("socket:"):
                    n += 1
            except OSError:
                pass
        return max(0, n - 1)

    def _sample_loop(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._peak_conn = max(self._peak_conn, self.connections())
            except OSError:
                return

    def mark(self) -> None:
        """Start the phase: its CPU time counts from here (not the clients' connection set-up)."""
        self._cpu0 = self._cpu()

    def sample(self) -> HostSample:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kb = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines() if line.startswith("Vm")}
        self._peak_conn = max(self._peak_conn, self.connections())
        return HostSample(kb["VmHWM"] / 1024, kb["VmRSS"] / 1024, self._peak_conn, self._cpu() - self._cpu0)

    def kill(self) -> None:
        """SIGKILL: the store lost (its keys with it), its sockets closed by the kernel."""
        self._stop.set()
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self._stop.set()
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> StoreHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--legacy", action="store_true", help="the pre-libuv TCPStore server (NVRx's rendezvous store)")
    parser.add_argument("--resctl", type=int, metavar="PORT", help="serve with resctl.launch.store_server (`resctl "
                        "store --listen 127.0.0.1:PORT`) on this port")
    args = parser.parse_args()
    if args.resctl is not None:
        _serve_resctl(args.resctl)
        return
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False, use_libuv=not args.legacy)
    print(store.port, flush=True)
    sys.stdin.read()  # until the harness closes it
    time.sleep(0)


def _serve_resctl(port: int) -> None:
    from resctl.launch.store_server import Listen, serve

    stop = threading.Event()

    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    serve(Listen("127.0.0.1", port), lambda at: print(at.port, flush=True), stop)


if __name__ == "__main__":
    main()
