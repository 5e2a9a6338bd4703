"""The hysteresis controller (`controller.policy = "hysteresis"`): balance the stages at runtime.

Pure decision logic over `RunView` snapshots (no devices, no clock): the same code decides live
and in the simulator.

Estimates, from the run's own measurements (exponential moving averages):
- rollout of a step = *bulk* + *tail*: the bulk lasts until the remaining requests would fill
  every engine only lightly (`tail_batch` each; device-seconds `bulk_dev_s` = a + b x R, R the
  width the rollout started with: `a` the work, which divides, `b` seconds every engine spends
  whatever its share, fitted once two widths were measured,
  `dynaresize.control.rollout_width`, while
  engines hold under half their slots, `BUSY_LOAD`: busier, the bulk's growth with width is
  where its end falls, and b = 0), the tail is the rest (`tail_s`, independent of R);
- training = `train_dev_s` device-seconds actually trained (streaming: without the waits for
  groups; scales as 1/T);
- pipelined rollouts (`RunView.pipelined`, staleness >= 1): the tail overlaps the next step's
  rollout, so a step's rollout costs `roll_dev_s` device-seconds of work (engines held until
  its tail, when the remaining requests fit at `tail_batch` per engine; a + b x R as above) plus
  `roll_tail_s` seconds per engine (held in the tail, waiting for the last requests: the
  same at any width), and its latency `latency_s` (start to last request) bounds the step
  from below: 1 + s steps must cover it;
- resize cost = the measured critical-path and wall times of past resizes;
- staleness 0: the measured step time with and without lending engines at rollout end.

Decisions (streaming training on, `streams_training`: the orchestrator trains each step's
micro-batches as their groups complete, see `dynaresize.core.stream`):
- inter-step (`at_step_start`): the split R that minimises the predicted step time, applied
  only if it beats the current split by more than the hysteresis `band`, the expected saving
  over `horizon_steps` exceeds `cost_margin` x the resize cost, and the last change is at least
  `min_dwell_steps` old (or the lending mode just changed, or, at staleness 0, the last
  change stopped at the trust region's edge and this one goes on in its direction: a move
  cut short, not a reversal; each step there runs and is measured at its split). One change
  at most doubles or halves either stage (a trust region: the model is fitted where the run
  is; splits measured in the last `MEASURED_FOR_STEPS` steps are candidates wherever they
  are), and the first 1 + s steps, which fill the pipeline, are not filed as any split's
  measured step time. At staleness >= 1, until the rollout was measured at two widths, a
  move to a split not measured needs `UNMEASURED_BAND` bands where engines hold under a
  quarter of their slots (`LIGHT_LOAD` x `engine_slots`): memory-bound, they may not speed
  up as the model assumes.
  Staleness 1: max(rollout, train), the stages overlap; with pipelined rollouts
  max(roll_dev_s(R) / R + roll_tail_s, train_dev_s / T, latency / (1 + s)).
  Staleness 0: the trainers stream through the groups as the measured `ready_profile` makes
  them ready (a fluid queue) and, when lending, the released engines through the tail; the
  rest follows the rollout, on the trainers, or on every device but one when lending
  (`Lending.pays`: predicted to beat never lending by the band, plus the model's own error
  until a resize has been measured; a resize counts `resize_guess_s` until one was). A step
  runs in one mode: without lending, no engine is lent at all. Devices released in the
  previous step come back here (blocking at staleness 0, before the rollout starts).
- intra-step, staleness 0, lending mode (`on_rollout_progress`): engines the tail has
  emptied go to training (`Lending.lend_idle`, idle ones first: nothing migrates); once the
  remaining requests fit on fewer engines at `tail_batch` each, release the surplus engines
  to training in waves (each at least a quarter of the engines; the next after the previous
  one applied) while the tail is predicted to outlast `cost_margin` resizes;
  `at_rollout_end`: lend every engine but one.
  At staleness 1 the released tail engines measured slower than keeping them (they come back
  at the next step start, right when the next rollout needs them), so the split does it.
  (Parts, plain objects the controller is composed of: the estimates and predictions in
  `dynaresize.control.hysteresis.model.StageModel`, the split choice's bookkeeping and scores in
  `dynaresize.control.hysteresis.split.SplitChoice`, the staleness-0 lending decisions in
  `dynaresize.control.hysteresis.lend.Lending`.)
"""

from __future__ import annotations

from dynaresize.config import Config
from dynaresize.control.base import Controller, Move, RunView
from dynaresize.control.hysteresis.lend import Lending
from dynaresize.control.hysteresis.model import HysteresisParams, StageModel
from dynaresize.control.hysteresis.split import MEASURED_FOR_STEPS, SplitChoice

__all__ = ["HysteresisController", "HysteresisParams"]

UNMEASURED_BAND = 2.0
"""Bands a move to a split not measured recently must promise (staleness >= 1, lightly loaded
engines) until the rollout was measured at two widths."""


class HysteresisController(Controller):
    """The policy: a `StageModel` (estimates, predictions), a `SplitChoice` (measured step
    times, candidate scores) and a `Lending` (staleness-0 lends), composed."""

    def __init__(self, params: HysteresisParams) -> None:
        self.p = params
        self.model = StageModel(params, streams_training=True)
        self.split = SplitChoice(self.model)
        self.lending = Lending(self.model, self.split)
        self._last_change_step = -10**9
        self._capped = 0
        """Staleness 0: +1 / -1 if the last split change stopped at the trust region's edge
        going up / down (the model wanted more rollout devices / fewer), else 0."""

    @classmethod
    def build(cls, cfg: Config) -> HysteresisController:
        """`controller.policy = "hysteresis"`, parameters from `[controller.hysteresis]`."""
        c = cfg.controller.hysteresis
        return cls(HysteresisParams(
            band=c.band, min_dwell_steps=c.min_dwell_steps, horizon_steps=c.horizon_steps,
            cost_margin=c.cost_margin, release_tail=c.release_tail, tail_batch=c.tail_batch,
            engine_slots=cfg.rollout.max_running_requests, resize_guess_s=c.resize_guess_s,
            lend_min_cv=c.lend_min_cv))

    @property
    def streams_training(self) -> bool:
        """Asks the orchestrator to train over completed groups during the rollout tail."""
        return self.model.streams_training

    @streams_training.setter
    def streams_training(self, value: bool) -> None:
        self.model.streams_training = value

    def predict_step_s(self, num_rollout: int, num_devices: int, staleness: int) -> float:
        """The model's step time at a split (`StageModel.predict_step_s`)."""
        return self.model.predict_step_s(num_rollout, num_devices, staleness)

    def at_step_start(self, view: RunView) -> list[Move]:
        model, split = self.model, self.split
        model.pipelined = view.pipelined
        model.update(view)
        split.measure_step(view)
        model.measure_round_trip(view)
        model.tail_start_s = None
        alloc = view.allocation
        n, r = alloc.num_devices, len(alloc.rollout)
        returning = self.lending.returning(view.step - 1)
        # Staleness 0: nothing trains between two steps, so the split changes before the
        # rollout starts (it then runs, and is measured, at its full width).
        blocking = view.staleness == 0
        split.plan(view.step, r + returning, model.lend_ok)
        if model.bulk_dev_s is None or model.train_dev_s is None or view.num_pending_resizes:
            return [Move("train->rollout", returning, blocking)] if returning else []
        base = r + returning  # the split before the tail release
        was_ok = model.lend_ok
        model.lend_ok = view.staleness == 0 and self.streams_training and \
            self.p.release_tail and self.lending.pays(n, base)
        split.plan(view.step, base, model.lend_ok)
        score = split.scores(n, base, view.staleness, view.step)
        best = min(split.candidates(n, base, view.step),
                   key=lambda k: (score(k), abs(k - base)))
        now_s = score(base)
        gain_s = now_s - score(best)
        # a change of lending mode re-plans the split at once (it was chosen for the mode);
        # at staleness 0 (each step runs and is measured at its split) a move the trust
        # region stopped short may go on in its direction at once: not a reversal
        dwell_ok = (view.step - self._last_change_step >= self.p.min_dwell_steps
                    or was_ok != model.lend_ok
                    or (view.staleness == 0 and self._capped * (best - base) > 0))
        # at staleness >= 1, before two rollout widths were measured, a split not measured
        # recently is chosen on a model that counts every rollout device-second as work;
        # engines holding under `LIGHT_LOAD` of their slots are memory-bound (each iteration
        # reads the weights, however few requests it serves) and may not speed up: there
        # the move must promise `UNMEASURED_BAND` bands
        got = split.measured(model.lend_ok, best)
        guess = view.staleness and model.light(base) and not model.widths_fitted and (
            got is None or view.step - got[1] > MEASURED_FOR_STEPS)
        band = self.p.band * (UNMEASURED_BAND if guess else 1.0)
        worth = (gain_s > band * now_s and
                 gain_s * self.p.horizon_steps > self.p.cost_margin * model.cost_s(view))
        target = best if (dwell_ok and worth) else base
        split.plan(view.step, target, model.lend_ok)
        if target != base:
            self._last_change_step = view.step
            lo, hi = split.trust_region(n, base)
            self._capped = 1 if target == hi < n - 1 else -1 if target == lo > 1 else 0
        else:
            self._capped = 0
        return split.moves_to(r, target, blocking)

    def on_rollout_progress(self, view: RunView) -> list[Move]:
        self.model.observe_progress(view)
        return self.lending.release_tail(view)

    def at_rollout_end(self, view: RunView) -> list[Move]:
        return self.lending.at_rollout_end(view)
