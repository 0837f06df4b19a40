"""resctl: a torchrun replacement that keeps the GPUs training when a rank fails.

`resctl run train.py` resolves a TOML profile into an NVIDIA Resiliency Extension
`ft_launcher` command line and starts every worker through `resctl.shim`, which adds
heartbeats, in-process restart and async checkpointing to an unmodified script.
"""

import warnings as _warnings

__version__ = "0.1.0"

# The interpreter's own warning filters (its defaults, -W options, PYTHONWARNINGS), taken before resctl
# or what it imports (torch, NVRx, the launcher) adds any: a worker's script starts with these, as in a
# new interpreter (resctl.shim.target). Every resctl process imports this module first.
STARTUP_WARNING_FILTERS = tuple(_warnings.filters)
