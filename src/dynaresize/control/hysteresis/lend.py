"""Lending at staleness 0 (a part of `HysteresisController`, see
`dynaresize.control.hysteresis.controller` and docs/controller.md).

With streaming training the trainers work through a step's completed groups while its rollout
runs; the rest of the training waits for the last request. In lending mode
(`StageModel.lend_ok`, chosen at each step start by `pays`; only for response lengths with a
tail) rollout engines with nothing left to do in the step join the training (`lend`): during
the rollout once a quarter of the engines or more are idle (nothing migrates), and at its end
every engine but one. Lent engines come back at the next step start (`returning`).
"""

from __future__ import annotations

from dynaresize.control.base import Move, RunView
from dynaresize.control.hysteresis.model import StageModel, speedup_s

IDLE_SHARE = 4
"""During the rollout, lend idle engines only once at least 1 / IDLE_SHARE of them are
idle (fewer, larger lends: the same throughput, a fifth fewer resizes)."""


class Lending:
    """Staleness-0 lending decisions over the model (`model`: estimates, the lending mode
    `lend_ok`, the round trip)."""

    def __init__(self, model: StageModel) -> None:
        self.model = model
        self.p = model.p
        self._released: dict[int, int] = {}
        """Step -> rollout devices lent to training in it (they return at the next step)."""
        self._target: dict[int, int] = {}
        """Step -> the rollout width its last lend aims at (the next waits for it)."""

    def returning(self, step: int) -> int:
        """Devices lent in `step` (they come back now); forgets them."""
        return self._released.pop(step, 0)

    def pays(self, num_devices: int) -> bool:
        """Staleness 0: whether lending (at its best split) is predicted to beat never
        lending (at its best split) by more than the band. Lending needs a tail: with
        short, even response lengths (measured coefficient of variation under
        `lend_min_cv`) it would only time-share the devices, two resizes a step."""
        if self.model.response_cv is not None and self.model.response_cv < self.p.lend_min_cv:
            return False
        splits = range(1, num_devices)
        best_lend = min(self.model.stream_s0(r, num_devices, True) for r in splits)
        best_keep = min(self.model.stream_s0(r, num_devices, False) for r in splits)
        return best_lend < (1 - self.p.band) * best_keep

    def on_progress(self, view: RunView) -> list[Move]:
        """During the rollout: the engines the tail has emptied, at least a quarter of them."""
        r = len(view.allocation.rollout)
        idle = min(view.rollout_idle, r - 1)
        return self.lend(view, idle) if idle >= max(1, r // IDLE_SHARE) else []

    def at_rollout_end(self, view: RunView) -> list[Move]:
        """The next rollout waits for this step's update: every engine but one trains."""
        return self.lend(view, len(view.allocation.rollout) - 1)

    def lend(self, view: RunView, num_idle: int) -> list[Move]:
        """Lend `num_idle` engines with nothing left in the step (idle ones first: nothing
        migrates) if the training still to do gains more than `cost_margin` round trips."""
        r = len(view.allocation.rollout)
        if (num_idle < 1 or view.staleness != 0 or not self.model.streams_training
                or not self.p.release_tail or not self.model.lend_ok
                or view.num_pending_resizes or self.model.train_dev_s is None
                or r > self._target.get(view.step, r)):
            return []
        gain_s = speedup_s(view.train_todo * self.model.train_dev_s,
                           len(view.allocation.train), num_idle)
        if gain_s <= self.p.cost_margin * 2 * self.model.round_trip_s:  # there and back
            return []
        self._released[view.step] = self._released.get(view.step, 0) + num_idle
        self._target[view.step] = r - num_idle
        return [Move("rollout->train", num_idle, idle_first=True)]
