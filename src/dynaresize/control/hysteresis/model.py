"""The hysteresis controller's model of a step (see `dynaresize.control.hysteresis.controller`
and docs/controller.md): its parameters, the estimates it keeps from the run's own
measurements and the step times it predicts from them.

Pure: `StageModel.update` reads `RunView` histories; nothing here decides a move
(`dynaresize.control.hysteresis.split` and `dynaresize.control.hysteresis.lend` do, on this
model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from dynaresize.control.base import RunView
from dynaresize.control.rollout_width import WidthFit


@dataclass
class HysteresisParams:
    band: float = 0.05
    min_dwell_steps: int = 3
    horizon_steps: int = 4
    cost_margin: float = 2.0
    release_tail: bool = True
    """Staleness 0: lend rollout engines to training once they have nothing left to do in
    the step (`controller.hysteresis.release_tail`)."""
    ema: float = 0.5
    resize_guess_s: float = 5.0
    """Staleness 0: a resize's wall time assumed, until one was measured, when weighing
    lending engines to training (`controller.hysteresis.resize_guess_s`)."""
    lend_min_cv: float = 0.5
    """Staleness 0: lending needs response lengths with a tail: a measured coefficient of
    variation of at least this (`controller.hysteresis.lend_min_cv`)."""


GUESS_SHARE = 0.05
"""Until a resize was measured, a split move is assumed to cost this share of the last step
(scales with the run: a fixed guess in seconds would block every move of a run whose steps
last a second)."""


def ema(old: float | None, new: float, weight: float) -> float:
    """An exponential moving average's next value (`new` itself if there is none yet)."""
    return new if old is None else (1 - weight) * old + weight * new


def speedup_s(work_dev_s: float, num_devices: int, extra: int) -> float:
    """Seconds saved on `work_dev_s` device-seconds by `extra` more than `num_devices`."""
    return work_dev_s / num_devices - work_dev_s / (num_devices + extra)


def streamed_dev_s(profile: Sequence[float], work_dev_s: float, rollout_s: float,
                   num_train: int) -> float:
    """Training device-seconds done by the rollout's end (`rollout_s`) when `profile[i]` of
    `work_dev_s` is ready by (i + 1) / len(profile) of the rollout and `num_train` devices
    train throughout: a fluid queue's output, min over t of (work ready by t + capacity
    after t)."""
    points = len(profile)
    best = num_train * rollout_s
    for i, share in enumerate(profile):
        best = min(best, share * work_dev_s + num_train * rollout_s * (1 - (i + 1) / points))
    return min(best, work_dev_s)


DEEP_TAIL_SHARE = 0.0
"""Staleness >= 2: the share of the seconds per engine a step holds in its tail that its
pipelined rollout is charged. The pipeline is s + 1 steps deep and the loop moves on once a
run holds every engine it can get, so a tail's engines run beside the s later steps' runs and
their seconds are not on the step's pace (measured, dapo-7b 32 GPUs, das: the best fixed split
at s = 2 paces 57.8 s a step at 12 rollout engines, under the pre-tail device-seconds alone,
714 / 12 = 59.5 s; docs/controller.md)."""


def deep_tail_s(tail_s: float) -> float:
    """The tail seconds per engine a staleness >= 2 prediction charges (`DEEP_TAIL_SHARE`)."""
    return DEEP_TAIL_SHARE * tail_s


def median_recent(values: list[float], default: float) -> float:
    """Median of the last 8 `values`, else `default`."""
    recent = sorted(values[-8:])
    return recent[len(recent) // 2] if recent else default


WHOLE_ROUNDS_MAX = 2
"""Up to this many micro-batches per trainer, `StageModel.train_s` counts them whole; with
more, balancing micro-batches of unequal sizes evens the trainers out (unseen runs, 20 steps:
the term at any count moved a drift run with 23-31 rounds from 1.008 to 0.972x the best static
split; kept to 2 rounds it changes only the runs it is for; docs/results.md)."""


class StageModel:
    """Estimates of a step's stages (EMAs of the run's measurements) and the step time they
    predict at a split (docs/controller.md, "The model")."""

    def __init__(self, params: HysteresisParams, streams_training: bool = True) -> None:
        self.p = params
        self.streams_training = streams_training
        """The orchestrator trains each step's groups as they complete (the staleness-0
        prediction then streams them)."""
        self.rollout_dev_s: float | None = None
        """Rollout latency x width (EMA): the device-seconds a step's rollout holds."""
        self.rollout_fit = WidthFit()
        self.train_dev_s: float | None = None
        """Device-seconds trained per step (EMA; streaming: without the waits for groups)."""
        self.roll_dev_s: float | None = None
        """Pipelined rollouts: device-seconds a step's rollout holds engines before its tail
        (`StepTiming.rollout_tail_device_s`) (EMA): work, the same at any width."""
        self.roll_tail_s = 0.0
        """Pipelined rollouts: seconds each engine then holds for its last requests (EMA of
        tail device-seconds / width): the same per engine at any width."""
        self.roll_fit = WidthFit()
        """How the rollout's / the pipelined rollout's device-seconds grow with width
        (`dynaresize.control.rollout_width`)."""
        self.num_micro_batches: float | None = None
        """Micro-batches a step trains (EMA; None: not measured): `train_s`."""
        self.response_cv: float | None = None
        """Coefficient of variation of the steps' response lengths (EMA): lending needs a
        tail (`HysteresisParams.lend_min_cv`)."""
        self.ready_profile: tuple[float, ...] = ()
        """Streaming: the share of a step's training ready by each tenth of its rollout
        (`StepTiming.ready_profile`, EMA per point)."""
        self.pipelined = False
        self.widths_measured = False
        """The rollout was measured at two widths or more (at any time in the run)."""
        self.seen_steps = 0
        self.cost_s = 0.0
        """A resize's critical path (median of the last 8 measured, else `GUESS_SHARE` of the
        last step): what a split move costs."""
        self.round_trip_s = params.resize_guess_s
        """A resize's wall time (median of the last 8 measured): the optimizer-step boundary
        is held that long; a lend is two of them (there and back)."""
        self.lend_ok = False
        """Staleness 0: the current step lends engines (its split was chosen for lending;
        `dynaresize.control.hysteresis.lend.Lending.pays`)."""

    def set_streams_training(self, value: bool) -> None:
        """Whether the orchestrator trains each step's groups as they complete."""
        self.streams_training = value

    def choose_lending(self, ok: bool) -> bool:
        """Record whether the current step lends engines; True if that changed."""
        changed = ok != self.lend_ok
        self.lend_ok = ok
        return changed

    # ------------------------------------------------------------------ measurements
    def update(self, view: RunView) -> None:
        """Fold the steps finished since the last call into the estimates, and the resizes
        measured so far into the resize costs."""
        self.pipelined = view.pipelined
        w = self.p.ema
        for timing in view.history[self.seen_steps:]:
            r = timing.num_rollout_devices
            self.train_dev_s = ema(self.train_dev_s, timing.train_work_s, w)
            if timing.response_cv is not None:
                self.response_cv = ema(self.response_cv, timing.response_cv, w)
            if timing.num_micro_batches:
                self.num_micro_batches = ema(self.num_micro_batches,
                                             timing.num_micro_batches, w)
            if timing.ready_profile:
                old = self.ready_profile
                self.ready_profile = tuple(
                    ema(old[i] if len(old) == len(timing.ready_profile) else None, x, w)
                    for i, x in enumerate(timing.ready_profile))
            if timing.rollout_device_s > 0:
                tail_dev_s = min(timing.rollout_tail_device_s, timing.rollout_device_s)
                self.roll_tail_s = ema(None if self.roll_dev_s is None else self.roll_tail_s,
                                       tail_dev_s / max(1, r), w)
                self.roll_dev_s = ema(self.roll_dev_s, timing.rollout_device_s - tail_dev_s, w)
                self.roll_fit.add(r, timing.rollout_device_s - tail_dev_s)
            self.rollout_dev_s = ema(self.rollout_dev_s, timing.rollout_s * r, w)
            self.rollout_fit.add(r, timing.rollout_s * r)
            self.widths_measured |= r != view.history[0].num_rollout_devices
        self.seen_steps = len(view.history)
        last = view.history[-1] if view.history else None
        self.cost_s = median_recent(view.resize_critical_s, GUESS_SHARE * (
            last.rollout_s + last.train_s) if last else 0.0)
        self.round_trip_s = median_recent(view.resize_wall_s, self.p.resize_guess_s)

    @property
    def ready(self) -> bool:
        """Both stages were measured: predictions can be made."""
        return self.rollout_dev_s is not None and self.train_dev_s is not None

    # ------------------------------------------------------------------ predictions
    def predict_step_s(self, num_rollout: int, num_devices: int, staleness: int) -> float:
        assert self.rollout_dev_s is not None and self.train_dev_s is not None
        if staleness == 0 and self.streams_training:
            return self.stream_s0(num_rollout, num_devices, self.lend_ok)
        train = self.train_s(num_devices - num_rollout)
        if staleness and self.pipelined and self.roll_dev_s is not None:
            # The tail overlaps the next step's rollout: both stages cost device-seconds.
            # Deeper (staleness >= 2) the tail runs beside s later steps (`deep_tail_s`).
            tail_s = self.roll_tail_s if staleness < 2 else deep_tail_s(self.roll_tail_s)
            rollout = tail_s + self.roll_fit.engine_s(self.roll_dev_s, num_rollout)
            return max(rollout, train)
        rollout = self.rollout_fit.engine_s(self.rollout_dev_s, num_rollout)
        return max(rollout, train) if staleness else rollout + train

    def train_s(self, num_train: int) -> float:
        """A step's training on `num_train` trainers: its device-seconds over them, or, with
        at most `WHOLE_ROUNDS_MAX` micro-batches per trainer, their mean times the most one
        trainer takes if that is more: a micro-batch trains on one trainer, so 64 of them
        take two rounds on 46 trainers as on 58 (bench/unseen.py, seed 2026, staleness 0,2,
        run 33: a resize 50 -> 38 rollout devices that gained nothing, 0.933x the best
        static split; with the term it stays, 1.005x)."""
        assert self.train_dev_s is not None
        spread_s = self.train_dev_s / num_train
        num_mb = round(self.num_micro_batches or 0)
        if num_mb < 1:
            return spread_s
        rounds = math.ceil(num_mb / num_train)
        if rounds > WHOLE_ROUNDS_MAX:
            return spread_s
        return max(spread_s, self.train_dev_s / num_mb * rounds)

    def stream_s0(self, num_rollout: int, num_devices: int, lend: bool) -> float:
        """Staleness 0, streaming: the trainers work through the rollout on this step's
        completed groups, then train the rest, alone or (`lend`) with every rollout device
        but one (a round trip of two resizes). The training done by the rollout's end is a
        fluid queue: work arrives as the measured `ready_profile` says (before one was
        measured: about half of the rollout's capacity is usable)."""
        assert self.rollout_dev_s is not None and self.train_dev_s is not None
        rollout = self.rollout_fit.engine_s(self.rollout_dev_s, num_rollout)
        num_train = num_devices - num_rollout
        if self.ready_profile:
            done = streamed_dev_s(self.ready_profile, self.train_dev_s, rollout, num_train)
        else:
            done = 0.5 * num_train * rollout
        left = max(0.0, self.train_dev_s - done)
        if lend:
            return (rollout + left / max(1, num_devices - 1)
                    + 2 * self.p.cost_margin * self.round_trip_s)
        return rollout + left / num_train
