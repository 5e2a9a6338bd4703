"""Lending at staleness 0 (a part of `HysteresisController`, see
`dynaresize.control.hysteresis.controller` and docs/controller.md).

With streaming training the trainers work through a step's completed groups while its rollout
runs; the rest of the training waits for the last request. In lending mode
(`StageModel.lend_ok`, chosen at each step start by `pays`; only for response lengths with a
tail) every rollout engine but one joins the training at the rollout's end
(`at_rollout_end`). Lent engines come back at the next step start (`returning`). Lending
engines the tail had emptied during the rollout too (a quarter of them at a time) measured
the same throughput at twice the resizes (docs/controller.md).
"""

from __future__ import annotations

from dynaresize.control.base import Move, RunView
from dynaresize.control.hysteresis.model import StageModel, speedup_s


class Lending:
    """Staleness-0 lending decisions over the model (`model`: estimates, the lending mode
    `lend_ok`, the round trip)."""

    def __init__(self, model: StageModel) -> None:
        self.model = model
        self.p = model.p
        self._released: dict[int, int] = {}
        """Step -> rollout devices lent to training in it (they return at the next step)."""

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

    def at_rollout_end(self, view: RunView) -> list[Move]:
        """The next rollout waits for this step's update: every engine but one (idle ones
        first: nothing migrates) trains, if the training still to do gains more than
        `cost_margin` round trips (there and back)."""
        r = len(view.allocation.rollout)
        if (r <= 1 or view.staleness != 0 or not self.model.streams_training
                or not self.p.release_tail or not self.model.lend_ok
                or view.num_pending_resizes or self.model.train_dev_s is None):
            return []
        gain_s = speedup_s(view.train_todo * self.model.train_dev_s,
                           len(view.allocation.train), r - 1)
        if gain_s <= self.p.cost_margin * 2 * self.model.round_trip_s:
            return []
        self._released[view.step] = r - 1
        return [Move("rollout->train", r - 1, idle_first=True)]
