"""`resctl store`: serve the job's rendezvous store on a machine that does not train (issue 42).

The nodes then run with `launch.store = "external"` and `--rdzv-endpoint` naming this store: no
training node hosts it, so any one of them may be lost (a restart round, not the job). The serving
itself is `resctl.launch.store_server`.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from resctl.cli.render import info

EPILOG = (
    "Example: resctl store --listen 0.0.0.0:29500   then on every node:   "
    "resctl run --nnodes 2:3 --rdzv-endpoint STORE_HOST:29500 --set launch.store=external train.py"
)


def store(
    listen: Annotated[str, typer.Option("--listen", help="ADDR:PORT to listen on: an address of this machine, "
                                        "0.0.0.0 (or [::]) for every interface; the port defaults to 29500.")] = "0.0.0.0:29500",
) -> None:
    """Serve the job's rendezvous store, off the training nodes.

    Every node's `resctl run` connects to it with launch.store = "external".
    Runs until SIGTERM or SIGINT; the store keeps its keys in memory, so a job whose store is stopped
    stops too (exit 95 on every node: docs/recovery.md). Start it before the nodes, on a machine that
    does not train, and keep it running until the job ends.
    """
    from resctl.launch import store_server

    where = store_server.parse_listen(listen)

    def ready(at: store_server.Listen) -> None:
        info(f"resctl store: serving the rendezvous store on {at.host}:{at.port} (pid {os.getpid()}); nodes: "
             f"resctl run --rdzv-endpoint {at.endpoint} --set launch.store=external ...")

    store_server.serve(where, ready)
    info("resctl store: stopped")
