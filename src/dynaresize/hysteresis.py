"""The hysteresis controller (`controller.policy = "hysteresis"`): balance the stages at runtime.

Pure decision logic over `RunView` snapshots (no devices, no clock): the same code decides live
and in the simulator.

Estimates, from the run's own measurements (exponential moving averages):
- rollout of a step = *bulk* + *tail*: the bulk lasts until the remaining requests would fill
  every engine only lightly (`tail_batch` each; device-seconds `bulk_dev_s` = a + b x R, R the
  width the rollout started with: `a` the work, which divides, `b` seconds every engine spends
  whatever its share, fitted once two widths were measured, `dynaresize.rollout_width`, while
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
micro-batches as their groups complete, see `dynaresize.stream`):
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
  (`_lending_pays`: predicted to beat never lending by the band, plus the model's own error
  until a resize has been measured; a resize counts `resize_guess_s` until one was). A step
  runs in one mode: without lending, no engine is lent at all. Devices released in the
  previous step come back here (blocking at staleness 0, before the rollout starts).
- intra-step, staleness 0, lending mode (`on_rollout_progress`): engines the tail has
  emptied go to training (`_lend_idle`, idle ones first: nothing migrates); once the
  remaining requests fit on fewer engines at `tail_batch` each, release the surplus engines
  to training in waves (each at least a quarter of the engines; the next after the previous
  one applied) while the tail is predicted to outlast `cost_margin` resizes;
  `at_rollout_end`: lend every engine but one.
  At staleness 1 the released tail engines measured slower than keeping them (they come back
  at the next step start, right when the next rollout needs them), so the split does it.
  (The staleness-0 lending decisions live in `dynaresize.hysteresis_lend`, the split
  choice's bookkeeping and scores in `dynaresize.hysteresis_split`: mixins.)
"""

from __future__ import annotations

from dataclasses import dataclass

from dynaresize.config import Config
from dynaresize.controller import Move, RunView, register_policy
from dynaresize.hysteresis_lend import Lending
from dynaresize.hysteresis_split import MEASURED_FOR_STEPS, SplitChoice, ema
from dynaresize.rollout_width import WidthFit, spans_widths


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
    lending engines to training (`controller.resize_guess_s`)."""
    lend_min_cv: float = 0.5
    """Staleness 0: lending needs response lengths with a tail: a measured coefficient of
    variation of at least this (`controller.lend_min_cv`)."""


UNMEASURED_BAND = 2.0
"""Bands a move to a split not measured recently must promise (staleness >= 1, lightly loaded
engines) until the rollout was measured at two widths."""

LIGHT_LOAD = 0.25
"""Engines holding under this share of their slots count as lightly loaded (memory-bound:
each decode iteration reads the weights however few requests it serves)."""

BUSY_LOAD = 0.5
"""Engines holding at least this share of their slots are busy: the bulk's growth with width
is where its end falls (at `tail_batch` per engine), not a per-engine floor."""


class HysteresisController(SplitChoice, Lending):
    streams_training = True
    """Asks the orchestrator to train over completed groups during the rollout tail."""

    def __init__(self, params: HysteresisParams) -> None:
        self.p = params
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
        self._latency_width = 1
        """The rollout width `latency_s` was last measured at."""
        self.response_cv: float | None = None
        """Coefficient of variation of the steps' response lengths (EMA): lending needs a
        tail (`HysteresisParams.lend_min_cv`)."""
        self.ready_profile: tuple[float, ...] = ()
        """Streaming: the share of a step's training ready by each tenth of its rollout
        (`StepTiming.ready_profile`, EMA per point)."""
        self._bulk_fit = WidthFit()
        self._roll_fit = WidthFit()
        """How the bulk's / the pipelined rollout's device-seconds grow with width
        (`dynaresize.rollout_width`)."""
        self._step_requests = 0
        """Requests in the newest step seen in progress (`RunView.rollout_total`)."""
        self._widths_fitted = False
        """Some rollout was measured at two widths (the floors are fitted)."""
        self._pipelined = False
        self._seen_steps = 0
        self._tail_start_s: float | None = None
        self._tail_start_by_step: dict[int, float] = {}
        self._rollout_start_by_step: dict[int, float] = {}
        self._released: dict[int, int] = {}
        self._tail_target: dict[int, int] = {}
        self._round_trip_s = 0.0
        """The cost of one resize, as of the last step start (predictions charge it)."""
        self._round_trip_measured = False
        self._lend_ok = False
        """Staleness 0: lend the engines at rollout end this step (`_lending_pays`)."""
        self._step_start_s: dict[int, float] = {}
        self._mode_of_step: dict[int, bool] = {}
        """Staleness 0: whether each step ran in lending mode (its split chosen for lending)."""
        self._split_of_step: dict[int, int] = {}
        """The split (rollout devices) each step was planned at."""
        self._split_step_s: dict[tuple[bool, int], tuple[float, int]] = {}
        """Measured step time (EMA) per (lending mode, split), and the last step it was
        measured in (a split the model favours but that measured slower is not chosen again
        on the model's word); measurements older than `MEASURED_FOR_STEPS` are forgotten (the
        workload may have drifted)."""
        self._mode_step_s: dict[bool, float] = {}
        """Staleness 0: measured step time (EMA) with and without lending at rollout end."""
        self._last_change_step = -10**9
        self._capped = 0
        """Staleness 0: +1 / -1 if the last split change stopped at the trust region's edge
        going up / down (the model wanted more rollout devices / fewer), else 0."""

    # ------------------------------------------------------------------ estimates
    def _update(self, view: RunView) -> None:
        for timing in view.history[self._seen_steps:]:
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
                self._roll_fit.add(timing.num_rollout_devices,
                                   timing.rollout_device_s - tail_dev_s)
                self.latency_s = ema(self.latency_s, timing.rollout_s, w)
                self._latency_width = timing.num_rollout_devices
            start = self._rollout_start_by_step.get(timing.step)
            tail_at = self._tail_start_by_step.get(timing.step)
            if start is not None and tail_at is not None:
                bulk_s = max(0.0, tail_at - start)
                tail_s = max(0.0, timing.rollout_s - bulk_s)
            else:
                bulk_s, tail_s = timing.rollout_s, 0.0
            self.bulk_dev_s = ema(self.bulk_dev_s, bulk_s * timing.num_rollout_devices, w)
            self._bulk_fit.add(timing.num_rollout_devices, bulk_s * timing.num_rollout_devices,
                               fit=self._light(timing.num_rollout_devices, BUSY_LOAD))
            self._widths_fitted |= spans_widths(self._bulk_fit.samples)
            self.tail_s = ema(self.tail_s, tail_s, w)
        self._seen_steps = len(view.history)

    def _light(self, num_rollout: int, load: float = LIGHT_LOAD) -> bool:
        """The newest step's requests leave `num_rollout` engines under `load` of their
        slots (or the slots or the requests are unknown)."""
        slots, requests = self.p.engine_slots, self._step_requests
        return not slots or not requests or requests < num_rollout * slots * load

    def _cost_s(self, view: RunView) -> float:
        if view.resize_critical_s:
            recent = sorted(view.resize_critical_s[-8:])
            return recent[len(recent) // 2]
        last = view.history[-1] if view.history else None
        return 0.05 * (last.rollout_s + last.train_s) if last else 0.0

    def predict_step_s(self, num_rollout: int, num_devices: int, staleness: int) -> float:
        assert self.bulk_dev_s is not None and self.train_dev_s is not None
        if staleness == 0 and self.streams_training and self.p.release_tail:
            return self._stream_s0(num_rollout, num_devices, self._lend_ok)
        train = self.train_dev_s / (num_devices - num_rollout)
        if staleness and self._pipelined and self.roll_dev_s is not None:
            # The tail overlaps the next step's rollout: both stages cost device-seconds.
            # But step k + 1 + s waits for step k's last request, so 1 + s steps cover the
            # rollout's latency: measured at one width, assumed to grow as 1/R below it and
            # not to shrink above it (a latency-bound run then sees no split worth a move).
            latency_s = (self.latency_s or 0.0) * max(1.0, self._latency_width / num_rollout)
            rollout = self.roll_tail_s + self._roll_fit.engine_s(self.roll_dev_s, num_rollout)
            return max(rollout, train, latency_s / (1 + staleness))
        rollout = (self.tail_s or 0.0) + self._bulk_fit.engine_s(self.bulk_dev_s, num_rollout)
        return max(rollout, train) if staleness else rollout + train

    def at_step_start(self, view: RunView) -> list[Move]:
        self._pipelined = view.pipelined
        self._update(view)
        self._measure_mode(view)
        walls = sorted(view.resize_wall_s[-8:])
        self._round_trip_measured = bool(walls)
        self._round_trip_s = walls[len(walls) // 2] if walls else self.p.resize_guess_s
        self._tail_start_s = None
        alloc = view.allocation
        n, r = alloc.num_devices, len(alloc.rollout)
        returning = self._released.pop(view.step - 1, 0)
        # Staleness 0: nothing trains between two steps, so the split changes before the
        # rollout starts (it then runs, and is measured, at its full width).
        blocking = view.staleness == 0
        self._mode_of_step[view.step] = self._lend_ok
        self._split_of_step[view.step] = r + returning
        if self.bulk_dev_s is None or self.train_dev_s is None or view.num_pending_resizes:
            return [Move("train->rollout", returning, blocking)] if returning else []
        base = r + returning  # the split before the tail release
        was_ok = self._lend_ok
        self._lend_ok = view.staleness == 0 and self.streams_training and \
            self.p.release_tail and self._lending_pays(n, base)
        self._mode_of_step[view.step] = self._lend_ok
        score = self._split_scores(n, base, view.staleness, view.step)
        best = min(self._candidates(n, base, view.step),
                   key=lambda k: (score(k), abs(k - base)))
        now_s = score(base)
        gain_s = now_s - score(best)
        # a change of lending mode re-plans the split at once (it was chosen for the mode);
        # at staleness 0 (each step runs and is measured at its split) a move the trust
        # region stopped short may go on in its direction at once: not a reversal
        dwell_ok = (view.step - self._last_change_step >= self.p.min_dwell_steps
                    or was_ok != self._lend_ok
                    or (view.staleness == 0 and self._capped * (best - base) > 0))
        # at staleness >= 1, before two rollout widths were measured, a split not measured
        # recently is chosen on a model that counts every rollout device-second as work;
        # engines holding under `LIGHT_LOAD` of their slots are memory-bound (each iteration
        # reads the weights, however few requests it serves) and may not speed up: there
        # the move must promise `UNMEASURED_BAND` bands
        got = self._split_step_s.get((self._lend_ok, best))
        guess = view.staleness and self._light(base) and not self._widths_fitted and (
            got is None or view.step - got[1] > MEASURED_FOR_STEPS)
        band = self.p.band * (UNMEASURED_BAND if guess else 1.0)
        worth = (gain_s > band * now_s and
                 gain_s * self.p.horizon_steps > self.p.cost_margin * self._cost_s(view))
        target = best if (dwell_ok and worth) else base
        self._split_of_step[view.step] = target
        if target != base:
            self._last_change_step = view.step
            lo, hi = self._trust_region(n, base)
            self._capped = 1 if target == hi < n - 1 else -1 if target == lo > 1 else 0
        else:
            self._capped = 0
        return self._moves_to(r, target, blocking)


def make_hysteresis(cfg: Config) -> HysteresisController:
    c = cfg.controller
    return HysteresisController(HysteresisParams(
        band=c.band, min_dwell_steps=c.min_dwell_steps, horizon_steps=c.horizon_steps,
        cost_margin=c.cost_margin, release_tail=c.release_tail, tail_batch=c.tail_batch,
        engine_slots=cfg.rollout.max_running_requests, resize_guess_s=c.resize_guess_s,
        lend_min_cv=c.lend_min_cv))


register_policy("hysteresis", make_hysteresis)
