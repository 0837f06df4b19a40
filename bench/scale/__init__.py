"""Recovery coordination measured at N simulated nodes: see `python -m bench.scale --help`."""
