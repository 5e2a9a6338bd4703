"""How a rollout's device-seconds grow with its width (pure; used by
`dynaresize.control.hysteresis.controller`).

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


class WidthFit:
    """The recent (width, device-seconds) of one kind of rollout, the fitted per-engine floor
    (`slope`) and the point predictions are anchored at, both updated once per step."""

    def __init__(self) -> None:
        self.samples: deque[tuple[int, float]] = deque(maxlen=WIDTH_WINDOW)
        self.slope = 0.0
        """The last fit over two widths or more (`width_slope`); 0 until then."""
        self._anchor: tuple[float, float] | None = None
        """(width, device-seconds): the samples' mean while they span two widths."""

    def add(self, width: int, dev_s: float, fit: bool = True) -> None:
        """Record a step's rollout; `fit=False` sets the floor to 0 (all work)."""
        self.samples.append((width, dev_s))
        self.slope = width_slope(self.samples, self.slope) if fit else 0.0
        n = len(self.samples)
        self._anchor = (sum(w for w, _ in self.samples) / n,
                        sum(y for _, y in self.samples) / n) \
            if spans_widths(self.samples) else None

    def engine_s(self, dev_s: float, width: int) -> float:
        """Seconds each of `width` engines spends on a rollout: the work divides, the
        per-engine floor (`slope`) does not. Anchored at the recent samples' mean while they
        span two widths or more, else at `dev_s` (EMA) at their width."""
        if not self.samples:
            return dev_s / width
        if self._anchor is not None:
            at_w, dev_s = self._anchor
        else:
            at_w = self.samples[-1][0]
        return max(0.0, dev_s + self.slope * (width - at_w)) / width
