"""GRPO group-normalised advantages in plain Python (no torch: the orchestrator and the
simulator use it; `train.grpo.group_advantages` delegates here for flat lists)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def group_advantages(rewards: Sequence[float], group_size: int, eps: float = 1e-6
                     ) -> list[float]:
    """(r - mean_group) / (std_group + eps), std unbiased, over consecutive groups of
    `group_size` rewards in (prompt, sample) order; an all-equal group gets exactly 0."""
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for a flat reward list, got {group_size}")
    values = [float(x) for x in rewards]
    if len(values) % group_size:
        raise ValueError(f"{len(values)} rewards do not split into groups of {group_size}")
    out: list[float] = []
    for start in range(0, len(values), group_size):
        group = values[start:start + group_size]
        if all(x == group[0] for x in group):
            out.extend([0.0] * group_size)
            continue
        mean = math.fsum(group) / group_size
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in group) / (group_size - 1))
        out.extend((x - mean) / (std + eps) for x in group)
    return out
