"""The hysteresis controller (`controller.policy = "hysteresis"`): balance the stages at runtime.

Pure decision logic over `RunView` snapshots (no devices, no clock): the same code decides live
and in the simulator. docs/controller.md lists every rule and constant with its measured effect.

A `StageModel` (`dynaresize.control.hysteresis.model`) keeps EMAs of the run's own
measurements and predicts the step time at any split: staleness 1, max(rollout, training)
(pipelined rollouts: the rollout's device-seconds before its tail, fitted a + b x R over the
widths measured, plus the seconds each engine holds in the tail, none at staleness >= 2:
`model.DEEP_TAIL_SHARE`); staleness 0, the rollout
plus the training left after it, the trainers streaming through the groups as the measured
`ready_profile` makes them ready (a fluid queue), alone or with every rollout device but one
when lending.

Decisions (streaming training on, `streams_training`):
- inter-step (`at_step_start`): the split in the trust region (staleness 0,
  `split.trust_region`: neither stage more than doubles or halves; staleness >= 1,
  `split.donor_region`: the stage giving devices keeps half; staleness >= 2,
  `split.deep_donor_region`: three quarters) that minimises the
  predicted step time; applied only if it beats the current split by more than the
  `band`, saves over `horizon_steps` more than `cost_margin` x a resize's cost, and the
  last change is at least `min_dwell_steps` old (or the lending mode just changed: the
  split was chosen for the mode).
  Devices lent in the previous step come back here (blocking at staleness 0, before the
  rollout starts). At staleness 0 the step's lending mode is chosen first (`Lending.pays`).
- at rollout end, staleness 0, lending mode (`at_rollout_end`): every rollout engine but one
  goes to training (`Lending`).
"""

from __future__ import annotations

from dynaresize.config import Config
from dynaresize.control.base import Controller, Move, RunView
from dynaresize.control.hysteresis.lend import Lending
from dynaresize.control.hysteresis.model import HysteresisParams, StageModel
from dynaresize.control.hysteresis.split import (
    deep_donor_region,
    donor_region,
    moves_to,
    trust_region,
)

__all__ = ["HysteresisController", "HysteresisParams"]

FIRST_MOVE_BANDS = 1.5
"""Staleness >= 1: bands a split change must promise while the run has measured its rollout
at one width only (the model's shape in the width is then a guess, and a move costs the
pipeline a step's rhythm)."""


class HysteresisController(Controller):
    """The policy: a `StageModel` (estimates, predictions) and a `Lending` (staleness-0
    lends), composed, and the split choice (module docstring)."""

    needs_progress = False
    """It decides at step start and rollout end only (the orchestrator skips
    `on_rollout_progress`)."""

    def __init__(self, params: HysteresisParams) -> None:
        self.p = params
        self.model = StageModel(params, streams_training=True)
        self.lending = Lending(self.model)
        self._last_change_step = -10**9

    @classmethod
    def build(cls, cfg: Config) -> HysteresisController:
        """`controller.policy = "hysteresis"`, parameters from `[controller.hysteresis]`."""
        c = cfg.controller.hysteresis
        return cls(HysteresisParams(
            band=c.band, min_dwell_steps=c.min_dwell_steps, horizon_steps=c.horizon_steps,
            cost_margin=c.cost_margin, release_tail=c.release_tail,
            resize_guess_s=c.resize_guess_s, lend_min_cv=c.lend_min_cv))

    @property
    def streams_training(self) -> bool:
        """Asks the orchestrator to train over completed groups during the rollout tail."""
        return self.model.streams_training

    @streams_training.setter
    def streams_training(self, value: bool) -> None:
        self.model.set_streams_training(value)

    def predict_step_s(self, num_rollout: int, num_devices: int, staleness: int) -> float:
        """The model's step time at a split (`StageModel.predict_step_s`)."""
        return self.model.predict_step_s(num_rollout, num_devices, staleness)

    def at_step_start(self, view: RunView) -> list[Move]:
        model = self.model
        model.update(view)
        n, r = view.allocation.num_devices, len(view.allocation.rollout)
        base = r + self.lending.returning(view.step - 1)  # the split before the lends
        # Staleness 0: nothing trains between two steps, so the split changes before the
        # rollout starts (it then runs at its full width).
        blocking = view.staleness == 0
        if not model.ready or view.num_pending_resizes:
            return moves_to(r, base, blocking)
        lend_changed = model.choose_lending(
            view.staleness == 0 and self.streams_training and self.p.release_tail
            and self.lending.pays(n))

        def predict_s(k: int) -> float:
            return model.predict_step_s(k, n, view.staleness)

        # Staleness >= 1 (max of the stages): the stage that receives devices cannot get
        # slower than now, the one that gives them stays where its fit holds.
        region = trust_region if view.staleness == 0 else (
            donor_region if view.staleness < 2 else deep_donor_region)
        lo, hi = region(n, base)
        best = min(range(lo, hi + 1), key=lambda k: (predict_s(k), abs(k - base)))
        now_s = predict_s(base)
        gain_s = now_s - predict_s(best)
        # the split was chosen for the lending mode: a change of mode re-plans it at once
        dwell_ok = (view.step - self._last_change_step >= self.p.min_dwell_steps
                    or lend_changed)
        band = self.p.band * (FIRST_MOVE_BANDS if view.staleness and not model.widths_measured
                              else 1.0)
        if (not dwell_ok or gain_s <= band * now_s
                or gain_s * self.p.horizon_steps <= self.p.cost_margin * model.cost_s):
            return moves_to(r, base, blocking)
        self._last_change_step = view.step
        return moves_to(r, best, blocking)

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        return []

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return self.lending.at_rollout_end(view)
