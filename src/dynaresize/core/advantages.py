"""GRPO group-normalised advantages in plain Python (no torch: the orchestrator and the
simulator use it; `train.grpo.group_advantages` delegates here for flat lists)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AdvantageSpec:
    """How a group's rewards become advantages (`train.loss`): the default is GRPO's."""

    scale_std: bool = True
    """True: GRPO, divide by the group's std; False: Dr. GRPO, r - mean only."""
    overlong_window: int = 0
    """DAPO overlong shaping window, tokens (0: off)."""
    overlong_penalty: float = 1.0
    max_new_tokens: int = 0
    """The response cap the window ends at."""


def advantage_spec(loss: object, max_new_tokens: int) -> AdvantageSpec | None:
    """The `AdvantageSpec` of a `train.loss` table (`config.LossConfig`); None for GRPO's
    defaults (no shaping, std scaling)."""
    window = int(loss.overlong_window)  # type: ignore[attr-defined]
    scale_std = loss.advantage == "grpo"  # type: ignore[attr-defined]
    if window <= 0 and scale_std:
        return None
    return AdvantageSpec(scale_std, window, float(loss.overlong_penalty),  # type: ignore
                         max_new_tokens)


def overlong_penalty(num_tokens: int, max_new_tokens: int, window: int,
                     penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 up to max_new_tokens - window tokens, then
    -penalty x (num_tokens - (max_new_tokens - window)) / window, and -penalty beyond the
    cap; 0 when `window` is 0."""
    if window <= 0:
        return 0.0
    start = max_new_tokens - window
    if num_tokens <= start:
        return 0.0
    if num_tokens > max_new_tokens:
        return -penalty
    return -penalty * (num_tokens - start) / window


def shaped_rewards(rewards: Sequence[float], lengths: Sequence[int],
                   spec: AdvantageSpec) -> list[float]:
    """The rewards the advantages are computed from: the task rewards plus the overlong
    penalty of each response's length (unchanged when shaping is off)."""
    if spec.overlong_window <= 0:
        return [float(r) for r in rewards]
    return [float(r) + overlong_penalty(n, spec.max_new_tokens, spec.overlong_window,
                                        spec.overlong_penalty)
            for r, n in zip(rewards, lengths, strict=True)]


def spec_advantages(rewards: Sequence[float], lengths: Sequence[int],
                    spec: AdvantageSpec | None) -> list[float]:
    """One group's advantages under `spec` (None: GRPO, bit for bit `group_advantages`)."""
    if spec is None:
        return group_advantages(rewards, len(rewards))
    return group_advantages(shaped_rewards(rewards, lengths, spec), len(rewards),
                            scale_std=spec.scale_std)


def group_advantages(rewards: Sequence[float], group_size: int, eps: float = 1e-6,
                     scale_std: bool = True) -> list[float]:
    """(r - mean_group) / (std_group + eps), std unbiased, over consecutive groups of
    `group_size` rewards in (prompt, sample) order; an all-equal group gets exactly 0.
    `scale_std` False (Dr. GRPO): r - mean_group."""
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
        if not scale_std:
            out.extend(x - mean for x in group)
            continue
        out.extend((x - mean) / (std + eps) for x in group)
    return out
