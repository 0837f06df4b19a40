"""resctl: a torchrun replacement that keeps the GPUs training when a rank fails.

`resctl run train.py` resolves a TOML profile into an NVIDIA Resiliency Extension
`ft_launcher` command line and starts every worker through `resctl.shim`, which adds
heartbeats, in-process restart and async checkpointing to an unmodified script.
"""

__version__ = "0.1.0"
