"""Lending at staleness 0 (a part of `HysteresisController`, see
`dynaresize.control.hysteresis.controller`).

With streaming training the trainers work through a step's completed groups while its rollout
runs; the rest of the training waits for the tail. In lending mode (`StageModel.lend_ok`, chosen at
each step start by `pays`; only for response lengths with a tail) three ways put
rollout engines on it:
- `lend_idle`: engines the tail has emptied (nothing migrates), a quarter of the engines or
  more at a time, when the training still to do gains more than `cost_margin` round trips;
- `release_tail`: once the remaining requests fit on fewer engines at `tail_batch` each,
  the surplus engines in waves (their requests migrate), while the tail outlasts the cost;
- `at_rollout_end`: every engine but one, when `pays` (the step with lending beats
  the step without by the band, in prediction and, once both ran, in measurement).
Lent engines come back at the next step start (`_released`).
"""

from __future__ import annotations

import math

from dynaresize.control.base import Move, RunView
from dynaresize.control.hysteresis.model import StageModel, speedup_s
from dynaresize.control.hysteresis.split import SplitChoice

UNMEASURED_GAIN = 0.2
"""Lending engines at rollout end before any step was measured must promise 20 %."""


class Lending:
    """Staleness-0 lending decisions over the model (`model`: estimates, the lending mode
    `lend_ok`, the round trip) and the split choice's measured step time per mode (`split`)."""

    def __init__(self, model: StageModel, split: SplitChoice) -> None:
        self.model = model
        self.split = split
        self.p = model.p
        self._released: dict[int, int] = {}
        """Step -> rollout devices lent to training in it (they return at the next step)."""
        self._tail_target: dict[int, int] = {}
        """Step -> the rollout width its last lend aims at (the next waits for it)."""

    def returning(self, step: int) -> int:
        """Devices lent in `step` (they come back now); forgets them."""
        return self._released.pop(step, 0)

    def pays(self, num_devices: int, num_rollout: int) -> bool:
        """Staleness 0: whether lending the engines at rollout end (at its best split) beats
        never lending (at its best split) by more than the band, in prediction and, once both
        modes have run, in the measured step times. Until a resize has been measured its cost
        is a guess, so the prediction must also beat its own error: how far it missed the
        measured step time of the mode the run is in (`UNMEASURED_GAIN` before any step).

        Lending needs a tail: with short, even response lengths (measured coefficient of
        variation under `lend_min_cv`) it would only time-share the devices, two resizes a
        step, and a workload without a tail keeps one split (it may gain 8-18% that way;
        the split without lending is still well ahead of the best static one)."""
        if self.model.response_cv is not None and self.model.response_cv < self.p.lend_min_cv:
            return False  # no tail: the gain would be time-sharing, two resizes a step
        lend, keep = self.split.mode_step_s(True), self.split.mode_step_s(False)
        if lend is not None and keep is not None and lend >= (1 - self.p.band) * keep:
            return False
        margin = self.p.band
        if not self.model.round_trip_measured:
            measured = self.split.mode_step_s(self.model.lend_ok)
            if measured is None:
                margin = UNMEASURED_GAIN
            else:
                predicted = self.model.stream_s0(num_rollout, num_devices, self.model.lend_ok)
                margin += abs(predicted - measured) / measured
        splits = range(1, num_devices)
        best_lend = min(self.model.stream_s0(r, num_devices, True) for r in splits)
        best_keep = min(self.model.stream_s0(r, num_devices, False) for r in splits)
        return best_lend < (1 - margin) * best_keep

    def release_tail(self, view: RunView) -> list[Move]:
        r = len(view.allocation.rollout)
        remaining = view.rollout_total - view.rollout_finished
        light = self.p.tail_batch
        streaming = self.model.streams_training
        idle_move = self.lend_idle(view, r)
        if idle_move:
            return idle_move
        if (not self.p.release_tail or view.staleness != 0 or
                (streaming and not self.model.lend_ok) or
                (not streaming and view.step in self._released) or
                r > self._tail_target.get(view.step, r) or
                view.num_pending_resizes or self.model.train_dev_s is None or
                self.model.tail_s is None or self.model.tail_start_s is None):
            return []
        release = r - max(1, math.ceil(remaining / light))
        # Streaming: release in waves as engines empty (each wave at least a quarter of the
        # engines, so the tail does not turn into a resize per completion).
        if release <= 0 or (streaming and release < max(1, r // 4)):
            return []
        cost_s = self.model.cost_s(view)
        if not view.resize_wall_s and view.history:  # cost unknown: only a long tail may try
            last = view.history[-1]
            cost_s = max(cost_s, UNMEASURED_GAIN * (last.rollout_s + last.train_s)
                         / self.p.cost_margin)
        tail_left_s = self.model.tail_s - (view.now_s - self.model.tail_start_s)
        t = len(view.allocation.train)
        train_gain_s = speedup_s(self.model.train_dev_s, t, release)
        if tail_left_s < self.p.cost_margin * cost_s or (
                not streaming and train_gain_s < self.p.cost_margin * 2 * cost_s):
            return []
        # Streaming: more trainers help only if the training still to do would outlast the
        # tail (otherwise moving engines just migrates the tail's requests and slows it).
        if streaming and view.train_todo * self.model.train_dev_s / t <= tail_left_s:
            return []
        self._lend(view.step, release)
        self._tail_target[view.step] = r - release  # the next wave waits for this one
        return [Move("rollout->train", release)]

    def lend_idle(self, view: RunView, r: int) -> list[Move]:
        """Staleness 0, streaming: engines the step's tail has emptied have nothing to do
        until the next step's rollout; lend them to training (nothing migrates), at least a
        quarter of the engines at a time, when the training still to do gains more from
        them than `cost_margin` resizes cost (before any resize was measured, also more than
        `UNMEASURED_GAIN` of the measured step time)."""
        idle = min(view.rollout_idle, r - 1)
        if (not self.model.streams_training or not self.p.release_tail or view.staleness != 0
                or not self.model.lend_ok
                or idle < max(1, r // 4) or view.num_pending_resizes
                or r > self._tail_target.get(view.step, r) or self.model.train_dev_s is None):
            return []
        gain_s = speedup_s(view.train_todo * self.model.train_dev_s,
                           len(view.allocation.train), idle)
        bar_s = self.p.cost_margin * 2 * self.model.round_trip_s  # there and back
        if not self.model.round_trip_measured and view.history:
            last = view.history[-1]
            step_s = self.split.mode_step_s(self.model.lend_ok)
            if step_s is None:
                step_s = last.rollout_s + last.train_s
            bar_s = max(bar_s, UNMEASURED_GAIN * step_s)
        if gain_s <= bar_s:
            return []
        self._lend(view.step, idle)
        self._tail_target[view.step] = r - idle
        return [Move("rollout->train", idle, idle_first=True)]

    def at_rollout_end(self, view: RunView) -> list[Move]:
        """Staleness 0, streaming: the next rollout waits for this step's update anyway, so
        every engine but one helps finish the training still to do (if it pays)."""
        r = len(view.allocation.rollout)
        if (not self.model.streams_training or not self.p.release_tail or view.staleness != 0 or
                r <= 1 or view.num_pending_resizes or self.model.train_dev_s is None):
            return []
        if self.model.bulk_dev_s is None or not self.model.lend_ok:
            return []
        gain_s = speedup_s(view.train_todo * self.model.train_dev_s, len(view.allocation.train),
                            r - 1)
        if gain_s < self.p.cost_margin * 2 * self.model.round_trip_s:
            return []
        self._lend(view.step, r - 1)
        return [Move("rollout->train", r - 1)]

    def _lend(self, step: int, num_devices: int) -> None:
        """Record rollout devices lent to training in `step`: they return at the next step."""
        self._released[step] = self._released.get(step, 0) + num_devices
