"""GRPO group-normalised advantages in plain Python (no torch: the orchestrator and the
simulator use it)."""

from __future__ import annotations

import math


def group_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) over one prompt's group; an all-equal group gets zeros."""
    n = len(rewards)
    if n == 0:
        return []
    mean = sum(rewards) / n
    var = sum((r - mean) ** 2 for r in rewards) / n
    std = math.sqrt(var)
    if std < eps:
        return [0.0] * n
    return [(r - mean) / (std + eps) for r in rewards]
