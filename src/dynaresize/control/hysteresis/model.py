"""The hysteresis controller's model of a step (see `dynaresize.control.hysteresis.controller`):
its parameters, the estimates it keeps from the run's own measurements and the step times it
predicts from them.

Pure: `StageModel.update` reads `RunView` histories, `observe_progress` the rollout's progress;
nothing here decides a move (`dynaresize.control.hysteresis.split` and
`dynaresize.control.hysteresis.lend` do, on this model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dynaresize.control.base import RunView
from dynaresize.control.rollout_width import WidthFit, spans_widths


@dataclass
class HysteresisParams:
    band: float = 0.05
    min_dwell_steps: int = 3
    horizon_steps: int = 4
    cost_margin: float = 2.0
    release_tail: bool = True
    tail_batch: int = 8
    """Requests per engine that still count as a lightly loaded engine in the tail."""
    ema: float = 0.5
    engine_slots: int = 0
    """Continuous-batching slots per engine (`rollout.max_running_requests`; 0: unknown)."""
    resize_guess_s: float = 5.0
    """Staleness 0: a resize's wall time assumed, until one was measured, when weighing
    lending engines to training (`controller.hysteresis.resize_guess_s`)."""
    lend_min_cv: float = 0.5
    """Staleness 0: lending needs response lengths with a tail: a measured coefficient of
    variation of at least this (`controller.hysteresis.lend_min_cv`)."""


LIGHT_LOAD = 0.25
"""Engines holding under this share of their slots count as lightly loaded (memory-bound:
each decode iteration reads the weights however few requests it serves)."""

BUSY_LOAD = 0.5
"""Engines holding at least this share of their slots are busy: the bulk's growth with width
is where its end falls (at `tail_batch` per engine), not a per-engine floor."""


def ema(old: float | None, new: float, weight: float) -> float:
    """An exponential moving average's next value (`new` itself if there is none yet)."""
    return new if old is None else (1 - weight) * old + weight * new


def speedup_s(work_dev_s: float, num_devices: int, extra: int) -> float:
    """Seconds saved on `work_dev_s` device-seconds by `extra` more than `num_devices`."""
    return work_dev_s / num_devices - work_dev_s / (num_devices + extra)


def streamed_dev_s(profile: Sequence[float], work_dev_s: float, bulk_s: float, tail_s: float,
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


class StageModel:
    """Estimates of a step's stages (EMAs of the run's measurements) and the step time they
    predict at a split (`dynaresize.control.hysteresis.controller`'s docstring describes the
    terms)."""

    def __init__(self, params: HysteresisParams, streams_training: bool = True) -> None:
        self.p = params
        self.streams_training = streams_training
        """The orchestrator trains each step's groups as they complete (the staleness-0
        prediction then streams them)."""
        self.bulk_dev_s: float | None = None
        self.tail_s: float | None = None
        self.train_dev_s: float | None = None
        self.roll_dev_s: float | None = None
        """Pipelined rollouts: device-seconds a step's rollout holds engines before its tail
        (`StepTiming.rollout_tail_device_s`) (EMA): work, the same at any width."""
        self.roll_tail_s = 0.0
        """Pipelined rollouts: seconds each engine then holds for its last requests (EMA of
        tail device-seconds / width): the same per engine at any width."""
        self.latency_s: float | None = None
        """Pipelined rollouts: a step's rollout from its start to its last request (EMA)."""
        self.latency_width = 1
        """The rollout width `latency_s` was last measured at."""
        self.response_cv: float | None = None
        """Coefficient of variation of the steps' response lengths (EMA): lending needs a
        tail (`HysteresisParams.lend_min_cv`)."""
        self.ready_profile: tuple[float, ...] = ()
        """Streaming: the share of a step's training ready by each tenth of its rollout
        (`StepTiming.ready_profile`, EMA per point)."""
        self.bulk_fit = WidthFit()
        self.roll_fit = WidthFit()
        """How the bulk's / the pipelined rollout's device-seconds grow with width
        (`dynaresize.control.rollout_width`)."""
        self.step_requests = 0
        """Requests in the newest step seen in progress (`RunView.rollout_total`)."""
        self.widths_fitted = False
        """Some rollout was measured at two widths (the floors are fitted)."""
        self.pipelined = False
        self.seen_steps = 0
        self.tail_start_s: float | None = None
        """When the current step's tail started (None: not yet)."""
        self.tail_start_by_step: dict[int, float] = {}
        self.rollout_start_by_step: dict[int, float] = {}
        self.round_trip_s = 0.0
        """The cost of one resize, as of the last step start (predictions charge it)."""
        self.round_trip_measured = False
        self.lend_ok = False
        """Staleness 0: the current step lends engines at rollout end (its split was chosen
        for lending; `dynaresize.control.hysteresis.lend.Lending.pays`)."""

    # ------------------------------------------------------------------ measurements
    def update(self, view: RunView) -> None:
        """Fold the steps finished since the last call into the estimates."""
        for timing in view.history[self.seen_steps:]:
            w = self.p.ema
            self.train_dev_s = ema(self.train_dev_s, timing.train_work_s, w)
            if timing.response_cv is not None:
                self.response_cv = ema(self.response_cv, timing.response_cv, w)
            if timing.ready_profile:
                old = self.ready_profile
                self.ready_profile = tuple(
                    ema(old[i] if len(old) == len(timing.ready_profile) else None, x, w)
                    for i, x in enumerate(timing.ready_profile))
            if timing.rollout_device_s > 0:
                tail_dev_s = min(timing.rollout_tail_device_s, timing.rollout_device_s)
                self.roll_tail_s = ema(None if self.roll_dev_s is None else self.roll_tail_s,
                                       tail_dev_s / max(1, timing.num_rollout_devices), w)
                self.roll_dev_s = ema(self.roll_dev_s, timing.rollout_device_s - tail_dev_s, w)
                self.roll_fit.add(timing.num_rollout_devices,
                                  timing.rollout_device_s - tail_dev_s)
                self.latency_s = ema(self.latency_s, timing.rollout_s, w)
                self.latency_width = timing.num_rollout_devices
            start = self.rollout_start_by_step.get(timing.step)
            tail_at = self.tail_start_by_step.get(timing.step)
            if start is not None and tail_at is not None:
                bulk_s = max(0.0, tail_at - start)
                tail_s = max(0.0, timing.rollout_s - bulk_s)
            else:
                bulk_s, tail_s = timing.rollout_s, 0.0
            self.bulk_dev_s = ema(self.bulk_dev_s, bulk_s * timing.num_rollout_devices, w)
            self.bulk_fit.add(timing.num_rollout_devices, bulk_s * timing.num_rollout_devices,
                              fit=self.light(timing.num_rollout_devices, BUSY_LOAD))
            self.widths_fitted |= spans_widths(self.bulk_fit.samples)
            self.tail_s = ema(self.tail_s, tail_s, w)
        self.seen_steps = len(view.history)

    def observe_progress(self, view: RunView) -> None:
        """Record the step's size, its rollout's start and (once the remaining requests fit
        at `tail_batch` per engine) its tail's start."""
        r = len(view.allocation.rollout)
        remaining = view.rollout_total - view.rollout_finished
        self.step_requests = view.rollout_total
        self.rollout_start_by_step[view.step] = view.rollout_started_s
        if self.tail_start_s is None and remaining <= r * self.p.tail_batch:
            self.tail_start_s = view.now_s
            self.tail_start_by_step[view.step] = view.now_s

    def measure_round_trip(self, view: RunView) -> None:
        """At a step start: the resize wall time predictions charge (median of the last 8
        measured, else `resize_guess_s`)."""
        walls = sorted(view.resize_wall_s[-8:])
        self.round_trip_measured = bool(walls)
        self.round_trip_s = walls[len(walls) // 2] if walls else self.p.resize_guess_s

    def light(self, num_rollout: int, load: float = LIGHT_LOAD) -> bool:
        """The newest step's requests leave `num_rollout` engines under `load` of their
        slots (or the slots or the requests are unknown)."""
        slots, requests = self.p.engine_slots, self.step_requests
        return not slots or not requests or requests < num_rollout * slots * load

    @staticmethod
    def cost_s(view: RunView) -> float:
        """A resize's critical-path cost: median of the last 8 measured, else 5 % of the
        last step."""
        if view.resize_critical_s:
            recent = sorted(view.resize_critical_s[-8:])
            return recent[len(recent) // 2]
        last = view.history[-1] if view.history else None
        return 0.05 * (last.rollout_s + last.train_s) if last else 0.0

    # ------------------------------------------------------------------ predictions
    def predict_step_s(self, num_rollout: int, num_devices: int, staleness: int) -> float:
        assert self.bulk_dev_s is not None and self.train_dev_s is not None
        if staleness == 0 and self.streams_training and self.p.release_tail:
            return self.stream_s0(num_rollout, num_devices, self.lend_ok)
        train = self.train_dev_s / (num_devices - num_rollout)
        if staleness and self.pipelined and self.roll_dev_s is not None:
            # The tail overlaps the next step's rollout: both stages cost device-seconds.
            # But step k + 1 + s waits for step k's last request, so 1 + s steps cover the
            # rollout's latency: measured at one width, assumed to grow as 1/R below it and
            # not to shrink above it (a latency-bound run then sees no split worth a move).
            latency_s = (self.latency_s or 0.0) * max(1.0, self.latency_width / num_rollout)
            rollout = self.roll_tail_s + self.roll_fit.engine_s(self.roll_dev_s, num_rollout)
            return max(rollout, train, latency_s / (1 + staleness))
        rollout = (self.tail_s or 0.0) + self.bulk_fit.engine_s(self.bulk_dev_s, num_rollout)
        return max(rollout, train) if staleness else rollout + train

    def stream_s0(self, num_rollout: int, num_devices: int, end_release: bool) -> float:
        """Staleness 0, streaming: the step without lending (the trainers work through the
        rollout on this step's completed groups, then train the rest) or with it (the
        rollout devices but one also join them for the tail and after the rollout, a round
        trip of two resizes). The training done by the rollout's end is a fluid queue:
        work arrives as the measured `ready_profile` says (before one was measured: about
        half of the bulk's capacity is usable) and is served by the devices training."""
        assert self.bulk_dev_s is not None and self.train_dev_s is not None
        tail = self.tail_s or 0.0
        bulk = self.bulk_fit.engine_s(self.bulk_dev_s, num_rollout)
        num_train = num_devices - num_rollout
        released = num_rollout - 1 if end_release else 0
        if self.ready_profile:
            done = streamed_dev_s(self.ready_profile, self.train_dev_s, bulk, tail,
                                  num_train, released)
        else:
            done = num_train * (0.5 * bulk + tail) + released * tail
        left = max(0.0, self.train_dev_s - done)
        if end_release:  # every device but the engine kept for the next rollout trains
            return (bulk + tail + left / max(1, num_devices - 1)
                    + 2 * self.p.cost_margin * self.round_trip_s)
        return bulk + tail + left / num_train
