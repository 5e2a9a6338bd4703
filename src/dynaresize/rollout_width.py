"""How a rollout's device-seconds grow with its width (pure; used by `dynaresize.hysteresis`).

A rollout on R engines costs device-seconds a + b x R: `a` is work, which divides among the
engines, `b` the seconds every engine spends whatever its share (decode iterations that read
the weights: memory-bound engines with few requests each take about as long at any width).
`b` is fitted by least squares over the recent (width, device-seconds) pairs once they hold
two widths; until then every device-second counts as work.
"""

from __future__ import annotations

from collections import deque

WIDTH_WINDOW = 6
"""Steps whose (rollout width, device-seconds) pairs fit how a rollout's device-seconds grow
with its width (`width_slope`)."""


def spans_widths(samples: deque[tuple[int, float]]) -> bool:
    """The samples hold two widths or more (a slope can be fitted)."""
    return len({w for w, _ in samples}) >= 2


def width_slope(samples: deque[tuple[int, float]], old: float) -> float:
    """Least-squares slope b of device-seconds = a + b x width over `samples`, clamped to
    [0, the seconds per engine]: b is the time every engine spends whatever its share (decode
    iterations that read the weights, memory-bound at small batch), a the work that divides.
    `old` (0 at first: all work) while the samples hold a single width."""
    if not spans_widths(samples):
        return old
    n = len(samples)
    mean_w = sum(w for w, _ in samples) / n
    mean_y = sum(y for _, y in samples) / n
    var = sum((w - mean_w) ** 2 for w, _ in samples)
    slope = sum((w - mean_w) * (y - mean_y) for w, y in samples) / var
    return min(max(0.0, slope), mean_y / mean_w)


def engine_s(dev_s: float, samples: deque[tuple[int, float]], slope: float,
             width: int) -> float:
    """Seconds each of `width` engines spends on a rollout: the work divides, the
    per-engine floor (`slope`, `width_slope`) does not. Anchored at the recent samples'
    mean while they span two widths or more, else at `dev_s` (EMA) at their width."""
    if not samples:
        return dev_s / width
    if spans_widths(samples):
        at_w = sum(w for w, _ in samples) / len(samples)
        dev_s = sum(y for _, y in samples) / len(samples)
    else:
        at_w = samples[-1][0]
    return max(0.0, dev_s + slope * (width - at_w)) / width
