"""Lending at staleness 0 (a mixin of `HysteresisController`, see `dynaresize.hysteresis`).

With streaming training the trainers work through a step's completed groups while its rollout
runs; the rest of the training waits for the tail. In lending mode (`_lend_ok`, chosen at
each step start by `_lending_pays`; only for response lengths with a tail) three ways put
rollout engines on it:
- `_lend_idle`: engines the tail has emptied (nothing migrates), a quarter of the engines or
  more at a time, when the training still to do gains more than `cost_margin` round trips;
- `on_rollout_progress`: once the remaining requests fit on fewer engines at `tail_batch` each,
  the surplus engines in waves (their requests migrate), while the tail outlasts the cost;
- `at_rollout_end`: every engine but one, when `_lending_pays` (the step with lending beats
  the step without by the band, in prediction and, once both ran, in measurement).
Lent engines come back at the next step start (`_released`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dynaresize.controller import Move, RunView
from dynaresize.rollout_width import WidthFit

if TYPE_CHECKING:
    from dynaresize.hysteresis import HysteresisParams

UNMEASURED_GAIN = 0.2
"""Lending engines at rollout end before any step was measured must promise 20 %."""


def _speedup_s(work_dev_s: float, num_devices: int, extra: int) -> float:
    """Seconds saved on `work_dev_s` device-seconds by `extra` more than `num_devices`."""
    return work_dev_s / num_devices - work_dev_s / (num_devices + extra)


def _streamed_dev_s(profile: Sequence[float], work_dev_s: float, bulk_s: float, tail_s: float,
                    num_train: int, num_released: int) -> float:
    """Training device-seconds done by the rollout's end (`bulk_s + tail_s`) when
    `profile[i]` of `work_dev_s` is ready by (i + 1) / len(profile) of the rollout and
    `num_train` devices train throughout, `num_released` more from the tail's start: a fluid
    queue's output, min over t of (work ready by t + capacity after t)."""
    end_s = bulk_s + tail_s
    points = len(profile)

    def capacity_after(t: float) -> float:
        return num_train * (end_s - t) + num_released * max(0.0, end_s - max(t, bulk_s))

    best = capacity_after(0.0)
    for i, share in enumerate(profile):
        best = min(best, share * work_dev_s + capacity_after((i + 1) / points * end_s))
    return min(best, work_dev_s)


class Lending:
    """Mixin: needs the controller's parameters, estimates and resize-cost bookkeeping."""

    p: HysteresisParams
    streams_training: bool
    bulk_dev_s: float | None
    tail_s: float | None
    train_dev_s: float | None
    _tail_start_s: float | None
    _tail_start_by_step: dict[int, float]
    _rollout_start_by_step: dict[int, float]
    _released: dict[int, int]
    _tail_target: dict[int, int]
    _round_trip_s: float
    _round_trip_measured: bool
    _lend_ok: bool
    _mode_step_s: dict[bool, float]
    _bulk_fit: WidthFit
    _step_requests: int
    ready_profile: tuple[float, ...]
    response_cv: float | None

    def _cost_s(self, view: RunView) -> float:
        raise NotImplementedError

    def _lending_pays(self, num_devices: int, num_rollout: int) -> bool:
        """Staleness 0: whether lending the engines at rollout end (at its best split) beats
        never lending (at its best split) by more than the band, in prediction and, once both
        modes have run, in the measured step times. Until a resize has been measured its cost
        is a guess, so the prediction must also beat its own error: how far it missed the
        measured step time of the mode the run is in (`UNMEASURED_GAIN` before any step).

        Lending needs a tail: with short, even response lengths (measured coefficient of
        variation under `lend_min_cv`) it would only time-share the devices, two resizes a
        step, and a workload without a tail keeps one split (it may gain 8-18% that way;
        the split without lending is still well ahead of the best static one)."""
        if self.response_cv is not None and self.response_cv < self.p.lend_min_cv:
            return False  # no tail: the gain would be time-sharing, two resizes a step
        lend, keep = self._mode_step_s.get(True), self._mode_step_s.get(False)
        if lend is not None and keep is not None and lend >= (1 - self.p.band) * keep:
            return False
        margin = self.p.band
        if not self._round_trip_measured:
            measured = self._mode_step_s.get(self._lend_ok)
            if measured is None:
                margin = UNMEASURED_GAIN
            else:
                predicted = self._stream_s0(num_rollout, num_devices, self._lend_ok)
                margin += abs(predicted - measured) / measured
        splits = range(1, num_devices)
        best_lend = min(self._stream_s0(r, num_devices, True) for r in splits)
        best_keep = min(self._stream_s0(r, num_devices, False) for r in splits)
        return best_lend < (1 - margin) * best_keep

    def _stream_s0(self, num_rollout: int, num_devices: int, end_release: bool) -> float:
        """Staleness 0, streaming: the step without lending (the trainers work through the
        rollout on this step's completed groups, then train the rest) or with it (the
        rollout devices but one also join them for the tail and after the rollout, a round
        trip of two resizes). The training done by the rollout's end is a fluid queue:
        work arrives as the measured `ready_profile` says (before one was measured: about
        half of the bulk's capacity is usable) and is served by the devices training."""
        assert self.bulk_dev_s is not None and self.train_dev_s is not None
        tail = self.tail_s or 0.0
        bulk = self._bulk_fit.engine_s(self.bulk_dev_s, num_rollout)
        num_train = num_devices - num_rollout
        released = num_rollout - 1 if end_release else 0
        if self.ready_profile:
            done = _streamed_dev_s(self.ready_profile, self.train_dev_s, bulk, tail,
                                   num_train, released)
        else:
            done = num_train * (0.5 * bulk + tail) + released * tail
        left = max(0.0, self.train_dev_s - done)
        if end_release:  # every device but the engine kept for the next rollout trains
            return (bulk + tail + left / max(1, num_devices - 1)
                    + 2 * self.p.cost_margin * self._round_trip_s)
        return bulk + tail + left / num_train

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        r = len(view.allocation.rollout)
        remaining = view.rollout_total - view.rollout_finished
        self._step_requests = view.rollout_total
        self._rollout_start_by_step[view.step] = view.rollout_started_s
        light = self.p.tail_batch
        if self._tail_start_s is None and remaining <= r * light:
            self._tail_start_s = view.now_s
            self._tail_start_by_step[view.step] = view.now_s
        streaming = self.streams_training
        idle_move = self._lend_idle(view, r)
        if idle_move:
            return idle_move
        if (not self.p.release_tail or view.staleness != 0 or
                (streaming and not self._lend_ok) or
                (not streaming and view.step in self._released) or
                r > self._tail_target.get(view.step, r) or
                view.num_pending_resizes or self.train_dev_s is None or self.tail_s is None or
                self._tail_start_s is None):
            return []
        release = r - max(1, math.ceil(remaining / light))
        # Streaming: release in waves as engines empty (each wave at least a quarter of the
        # engines, so the tail does not turn into a resize per completion).
        if release <= 0 or (streaming and release < max(1, r // 4)):
            return []
        cost_s = self._cost_s(view)
        if not view.resize_wall_s and view.history:  # cost unknown: only a long tail may try
            last = view.history[-1]
            cost_s = max(cost_s, UNMEASURED_GAIN * (last.rollout_s + last.train_s)
                         / self.p.cost_margin)
        tail_left_s = self.tail_s - (view.now_s - self._tail_start_s)
        t = len(view.allocation.train)
        train_gain_s = _speedup_s(self.train_dev_s, t, release)
        if tail_left_s < self.p.cost_margin * cost_s or (
                not streaming and train_gain_s < self.p.cost_margin * 2 * cost_s):
            return []
        # Streaming: more trainers help only if the training still to do would outlast the
        # tail (otherwise moving engines just migrates the tail's requests and slows it).
        if streaming and view.train_todo * self.train_dev_s / t <= tail_left_s:
            return []
        self._lend(view.step, release)
        self._tail_target[view.step] = r - release  # the next wave waits for this one
        return [Move("rollout->train", release)]

    def _lend_idle(self, view: RunView, r: int) -> list[Move]:
        """Staleness 0, streaming: engines the step's tail has emptied have nothing to do
        until the next step's rollout; lend them to training (nothing migrates), at least a
        quarter of the engines at a time, when the training still to do gains more from
        them than `cost_margin` resizes cost (before any resize was measured, also more than
        `UNMEASURED_GAIN` of the measured step time)."""
        idle = min(view.rollout_idle, r - 1)
        if (not self.streams_training or not self.p.release_tail or view.staleness != 0
                or not self._lend_ok
                or idle < max(1, r // 4) or view.num_pending_resizes
                or r > self._tail_target.get(view.step, r) or self.train_dev_s is None):
            return []
        gain_s = _speedup_s(view.train_todo * self.train_dev_s, len(view.allocation.train), idle)
        bar_s = self.p.cost_margin * 2 * self._round_trip_s  # there and back
        if not self._round_trip_measured and view.history:
            last = view.history[-1]
            step_s = self._mode_step_s.get(self._lend_ok, last.rollout_s + last.train_s)
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
        if (not self.streams_training or not self.p.release_tail or view.staleness != 0 or
                r <= 1 or view.num_pending_resizes or self.train_dev_s is None):
            return []
        if self.bulk_dev_s is None or not self._lend_ok:
            return []
        gain_s = _speedup_s(view.train_todo * self.train_dev_s, len(view.allocation.train),
                            r - 1)
        if gain_s < self.p.cost_margin * 2 * self._round_trip_s:
            return []
        self._lend(view.step, r - 1)
        return [Move("rollout->train", r - 1)]

    def _lend(self, step: int, num_devices: int) -> None:
        """Record rollout devices lent to training in `step`: they return at the next step."""
        self._released[step] = self._released.get(step, 0) + num_devices
