"""Checkpoint-interval model: Young/Daly optimum on the blocking cost plus the async back-pressure
constraint. Pure math, no I/O; `resctl tune-interval` and `resctl report` call it."""

from resctl.tuning.model import (
    Alternative,
    Costs,
    Prediction,
    Recommendation,
    daly_interval,
    evaluate,
    recommend,
    young_interval,
)

__all__ = [
    "Alternative",
    "Costs",
    "Prediction",
    "Recommendation",
    "daly_interval",
    "evaluate",
    "recommend",
    "young_interval",
]
