"""A fresh key space in the launcher's store for each cycle of workers.

Under `resctl run` the workers' `MASTER_ADDR:MASTER_PORT` is the launcher's rendezvous store
(`resctl.launch.adapters._agent_store`), which outlives the workers, as torchrun's does. It also
outlives a restart: the keys a process group of the last cycle left there (each rank's gloo
address, the barrier counters) are still there when the next cycle's ranks meet, and a rank that
read a dead peer's address failed with "Gloo connectFullMesh failed ... Connection refused". torchrun
2.13 has the same race (its shared store is kept across restarts too; seen here in 7 of 12 runs on
CPU). Here every store torch makes for `env://` or `tcp://` from the launcher's store is a
`PrefixStore` over it, with the key space the launchers named for this rendezvous round
(`RESCTL_STORE_PREFIX`, the same on every node: a replaced node's restart count starts at 0 again),
so each round starts empty. The in-process restart's application store lives there too.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from resctl.patching import Patches
from resctl.profile import contract


def uses_agent_store(env: Any = os.environ) -> bool:
    return bool(env.get(contract.AGENT_STORE) == "True")


def round_prefix(env: Any = os.environ) -> str:
    """This round's key space in the launcher's store."""
    return env.get(contract.STORE_PREFIX) or f"/worker/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def prefix_per_cycle(patches: Patches) -> None:
    """Patch torch's `_create_c10d_store` (env:// and tcp:// rendezvous) while the agent's store is used."""
    if not uses_agent_store():
        return
    import torch.distributed as dist

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the attribute is a function

    create = rendezvous._create_c10d_store

    def create_in_cycle(*args: Any, **kwargs: Any) -> Any:
        store = create(*args, **kwargs)
        if not uses_agent_store():  # the script changed its environment: torch made a store of its own
            return store
        return dist.PrefixStore(round_prefix(), store)

    patches.set(rendezvous, "_create_c10d_store", create_in_cycle)
