"""The splits one change may reach, and the moves that reach one (pure; a part of
`HysteresisController`, see `dynaresize.control.hysteresis.controller` and
docs/controller.md)."""

from __future__ import annotations

import math

from dynaresize.control.base import Move

TRUST_FACTOR = 2
"""One split change grows or shrinks either stage by at most this factor."""


def trust_region(num_devices: int, base: int) -> tuple[int, int]:
    """The rollout widths (lowest, highest) one change may reach from `base`: neither stage
    more than doubles or halves (the model is fitted where the run is; far from it its shape
    is a guess)."""
    t, f = num_devices - base, TRUST_FACTOR
    return (max(1, math.ceil(base / f), num_devices - f * t),
            min(num_devices - 1, f * base, num_devices - math.ceil(t / f)))


def donor_region(num_devices: int, base: int) -> tuple[int, int]:
    """The rollout widths (lowest, highest) one change may reach from `base` at staleness
    >= 1: the stage that gives devices keeps at least half of them (the gain the model
    predicts on the other stage may not come; the donor's loss then does)."""
    t, f = num_devices - base, TRUST_FACTOR
    return max(1, math.ceil(base / f)), num_devices - math.ceil(t / f)


DEEP_DONOR_KEEP = (3, 4)
"""Staleness >= 2: the share (numerator, denominator) of its devices the stage that gives
devices keeps in one change (`deep_donor_region`)."""


def deep_donor_region(num_devices: int, base: int) -> tuple[int, int]:
    """`donor_region` at staleness >= 2: the giving stage keeps `DEEP_DONOR_KEEP` (3/4) of
    its devices (one may always move). A resize there takes engines where they are and
    applies at once (`Resizer.deep`), and the model charges no tail
    (`model.DEEP_TAIL_SHARE`), so a wrong prediction costs the whole move from the next
    step on (unseen drift, 40 GPUs, s = 2: 15 -> 9 rollout devices in one change, 0.998x
    the best static split; 12 at most now: 1.138x; docs/controller.md)."""
    t, (keep, of) = num_devices - base, DEEP_DONOR_KEEP
    return (max(1, min(base - 1, -(-keep * base // of))),
            min(num_devices - 1, max(base + 1, num_devices - (-(-keep * t // of)))))


def moves_to(num_rollout: int, target: int, blocking: bool = False) -> list[Move]:
    """The move from `num_rollout` rollout devices to `target` (none if equal)."""
    if target > num_rollout:
        return [Move("train->rollout", target - num_rollout, blocking)]
    if target < num_rollout:
        return [Move("rollout->train", num_rollout - target, blocking)]
    return []
