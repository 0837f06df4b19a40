"""Events: what the shim records per rank and what report / tune-interval read."""
