"""Cluster health that acts: no-progress stop, stragglers, cluster preflight, placement (docs/recovery.md)."""
