"""The hysteresis controller is pure: decisions from synthetic RunViews, in milliseconds."""

from __future__ import annotations

from collections import deque

import pytest

from dynaresize.control.base import RunView, StepTiming
from dynaresize.control.hysteresis.controller import HysteresisController, HysteresisParams
from dynaresize.control.rollout_width import width_slope
from dynaresize.core.allocation import Allocation


def view(step: int, alloc: Allocation, history: list[StepTiming], staleness: int = 1,
         **kw: object) -> RunView:
    return RunView(step=step, now_s=100.0 * step, allocation=alloc, staleness=staleness,
                   history=history, **kw)  # type: ignore[arg-type]


def timing(step: int, rollout_s: float, train_s: float, r: int, t: int) -> StepTiming:
    return StepTiming(step, rollout_s, train_s, 1000, r, t)


def test_moves_devices_to_the_slower_stage_once_and_then_dwells() -> None:
    ctl = HysteresisController(HysteresisParams(min_dwell_steps=3, cost_margin=0.0))
    alloc = Allocation.initial(2, 6)          # rollout starved: 100 s vs train 10 s
    hist = [timing(0, 100.0, 10.0, 2, 6)]
    moves = ctl.at_step_start(view(1, alloc, hist))
    # 200 rollout device-s, 60 train device-s: max(200/R, 60/(8-R)) is least at R = 6, but
    # one move at most doubles the rollout stage (the trust region): R = 4
    assert [(m.move, m.num_devices) for m in moves] == [("train->rollout", 2)]
    # right after a change, the dwell time forbids another one even if estimates move
    hist.append(timing(1, 20.0, 80.0, 7, 1))
    assert ctl.at_step_start(view(2, Allocation.initial(7, 1), hist)) == []


def test_one_move_at_most_doubles_or_halves_either_stage() -> None:
    """The model is fitted at the current split; far from it its shape is a guess (at 128
    GPUs it once sent every trainer but one to the rollout). Splits measured recently stay
    candidates wherever they are."""
    ctl = HysteresisController(HysteresisParams())
    assert ctl.split.candidates(128, 25, step=1) == list(range(13, 51))   # R <= 50 (T >= 52)
    assert ctl.split.candidates(8, 2, step=1) == [1, 2, 3, 4]
    assert ctl.split.candidates(8, 6, step=1) == [4, 5, 6, 7]              # T <= 4
    ctl.split._split_step_s = {(False, 100): (9.0, 1)}
    assert 100 in ctl.split.candidates(128, 25, step=2)
    assert 100 not in ctl.split.candidates(128, 25, step=20)                # forgotten


def test_a_first_move_on_the_models_word_needs_twice_the_band() -> None:
    """Until the rollout was measured at two widths, the model counts every rollout
    device-second as work; engines holding under a quarter of their slots are memory-bound
    and may not speed up. There, at staleness >= 1, a move to a split not measured needs
    twice the band; with busy engines, or once two widths were measured, the band."""
    def moves(hist: list[StepTiming], r: int, requests: int = 0) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=0.05, cost_margin=0.0,
                                                    engine_slots=32))
        ctl.model.step_requests = requests
        v = view(len(hist), Allocation.initial(r, 16 - r), hist)
        return [(m.move, m.num_devices) for m in ctl.at_step_start(v)]

    # 8R/8T: max(640 rollout device-s / R, 800 training device-s / (16 - R)) is 100 s now,
    # 91.4 s at R = 7 (8.6% better)
    assert moves([timing(0, 80.0, 100.0, 8, 8)], 8, requests=8 * 7) == []
    # the same with busy engines (8 x 32 requests): the band
    assert moves([timing(0, 80.0, 100.0, 8, 8)], 8, requests=8 * 32) == [("rollout->train", 1)]
    # the same work measured at 7R/9T too: it divides (slope 0), and the band applies
    two_widths = [timing(0, 640.0 / 7, 800.0 / 9, 7, 9), timing(1, 80.0, 100.0, 8, 8)]
    assert moves(two_widths, 8, requests=8 * 7) == [("rollout->train", 1)]


def test_rollout_seconds_that_do_not_divide_with_the_width_are_learned() -> None:
    """Memory-bound engines (few requests each) take as long at any width: their
    device-seconds grow with the width. Once two widths were measured, the fitted per-engine
    floor stops the model from sending more engines to a rollout they cannot speed up."""
    assert width_slope(deque([(4, 40.0), (4, 44.0)]), 0.0) == 0.0      # one width: all work
    assert width_slope(deque([(4, 40.0), (8, 80.0)]), 0.0) == 10.0
    assert width_slope(deque([(4, 40.0), (8, 40.0), (8, 40.0)]), 3.0) == 0.0  # pure work
    assert width_slope(deque([(4, 10.0), (8, 80.0)]), 0.0) == 90.0 / 12  # <= per engine
    assert width_slope(deque([(8, 80.0)] * 3), 5.0) == 5.0              # kept

    def rollout_at(ctl: HysteresisController, r: int) -> float:
        return ctl.predict_step_s(r, 64, 1)

    ctl = HysteresisController(HysteresisParams(cost_margin=0.0))
    hist = [timing(0, 10.0, 1.0, 8, 56)]                                 # 80 device-s at 8
    ctl.at_step_start(view(1, Allocation.initial(8, 56), hist))
    assert rollout_at(ctl, 16) == 5.0                                    # all work: halves
    hist += [timing(1, 10.0, 1.0, 16, 48), timing(2, 10.0, 1.0, 16, 48)]  # 160 at 16
    ctl._last_change_step = -10
    moves = ctl.at_step_start(view(3, Allocation.initial(16, 48), hist))
    assert abs(rollout_at(ctl, 32) - 10.0) < 1e-9 and abs(rollout_at(ctl, 8) - 10.0) < 1e-9
    assert all(m.move != "train->rollout" for m in moves)


def test_band_keeps_a_nearly_balanced_split() -> None:
    ctl = HysteresisController(HysteresisParams(band=0.1, cost_margin=0.0))
    alloc = Allocation.initial(4, 4)
    hist = [timing(0, 50.0, 46.0, 4, 4)]      # predicted gain well under 10 %
    assert ctl.at_step_start(view(1, alloc, hist)) == []


def test_cost_gate_blocks_moves_that_do_not_pay_off() -> None:
    ctl = HysteresisController(HysteresisParams(band=0.0, horizon_steps=1, cost_margin=10.0))
    alloc = Allocation.initial(4, 4)
    hist = [timing(0, 60.0, 40.0, 4, 4)]
    expensive = view(1, alloc, hist, resize_critical_s=[50.0])
    assert ctl.at_step_start(expensive) == []


def test_tail_release_at_staleness_0_and_return_next_step() -> None:
    ctl = HysteresisController(HysteresisParams(cost_margin=1.0, tail_batch=1))
    alloc = Allocation.initial(6, 2)
    ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 50.0, 200.0, 300.0
    ctl.model.seen_steps = 1
    ctl.model.lend_ok = True  # the step runs in lending mode (chosen at its start)
    hist = [timing(0, 100.0, 100.0, 6, 2)]
    busy = view(1, alloc, hist, staleness=0, rollout_total=64, rollout_finished=10,
                resize_critical_s=[1.0])
    assert ctl.on_rollout_progress(busy) == []            # still in the bulk
    keeps_up = view(1, alloc, hist, staleness=0, rollout_total=64, rollout_finished=62,
                    resize_critical_s=[1.0], train_todo=0.1)
    assert ctl.on_rollout_progress(keeps_up) == []        # the trainers finish within the tail
    tail = view(1, alloc, hist, staleness=0, rollout_total=64, rollout_finished=62,
                resize_critical_s=[1.0], train_todo=0.9)
    ctl.model.lend_ok = False
    assert ctl.on_rollout_progress(tail) == []            # the mode without lending keeps them
    ctl.model.lend_ok = True
    moves = ctl.on_rollout_progress(tail)
    assert [(m.move, m.num_devices) for m in moves] == [("rollout->train", 4)]
    assert ctl.on_rollout_progress(tail) == []            # the next wave waits for this one
    after = Allocation.initial(2, 6)
    back = ctl.at_step_start(view(2, after, hist, staleness=0, resize_critical_s=[1.0]))
    # back to the split that minimises the predicted step time (streaming: the trainers work
    # through the rollout and the released devices through its tail)
    best = min(range(1, 8), key=lambda r: (ctl.predict_step_s(r, 8, 0), abs(r - 6)))
    assert [(m.move, m.num_devices) for m in back] == [("train->rollout", best - 2)]
    serial = HysteresisController(HysteresisParams())
    serial.streams_training = False
    serial.model.tail_s, serial.model.train_dev_s, serial.model.bulk_dev_s = 50.0, 200.0, 300.0
    # without streaming the stages add up: 50 + 300/R + 200/(8-R), least at R = 4
    assert min(range(1, 8), key=lambda r: serial.predict_step_s(r, 8, 0)) == 4
    assert ctl.predict_step_s(best, 8, 0) < serial.predict_step_s(4, 8, 0)


def test_no_tail_release_at_staleness_1() -> None:
    ctl = HysteresisController(HysteresisParams(cost_margin=0.0, tail_batch=1))
    ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 50.0, 200.0, 300.0
    v = view(1, Allocation.initial(6, 2), [], staleness=1, rollout_total=64,
             rollout_finished=62)
    assert ctl.on_rollout_progress(v) == []


def test_lending_at_rollout_end_stops_once_measured_slower() -> None:
    """Staleness 0, streaming: lending every engine but one at rollout end is tried only when
    predicted to pay by far, and dropped (with the split it was chosen for) once the measured
    step time with lending is not better than without."""
    ctl = HysteresisController(HysteresisParams(cost_margin=1.0, min_dwell_steps=5))
    ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 5.0, 800.0, 300.0
    ctl.model.seen_steps = 1
    hist = [timing(0, 100.0, 100.0, 4, 4)]
    walls = [1.0]

    def at(step: int, now_s: float, alloc: Allocation) -> list[tuple[str, int]]:
        v = RunView(step=step, now_s=now_s, allocation=alloc, staleness=0, history=hist,
                    resize_wall_s=walls, resize_critical_s=walls)
        return [(m.move, m.num_devices) for m in ctl.at_step_start(v)]

    at(1, 0.0, Allocation.initial(4, 4))
    assert ctl.model.lend_ok                      # training-heavy: lending predicted to pay
    end = RunView(step=1, now_s=50.0, allocation=Allocation.initial(4, 4), staleness=0,
                  history=hist, resize_wall_s=walls, train_todo=0.8)
    assert [(m.move, m.num_devices) for m in ctl.at_rollout_end(end)] == [("rollout->train", 3)]
    # step 1 (lent) measured at 300 s; step 2 (not lent) at 100 s: lending stops
    ctl.split._mode_step_s[False] = 100.0
    at(2, 300.0, Allocation.initial(1, 7))
    assert not ctl.model.lend_ok
    end2 = RunView(step=2, now_s=350.0, allocation=Allocation.initial(4, 4), staleness=0,
                   history=hist, resize_wall_s=walls, train_todo=0.8)
    assert ctl.at_rollout_end(end2) == []


def test_unmeasured_lending_must_beat_the_models_own_error() -> None:
    """Staleness 0, no resize measured yet: lending is tried when its predicted gain exceeds
    the band plus how far the model missed the measured step time (not a fixed 20 %)."""
    def decide(measured_keep_s: float) -> bool:
        ctl = HysteresisController(HysteresisParams())
        ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 5.0, 800.0, 300.0
        ctl.model.seen_steps, ctl.model.round_trip_s = 1, 10.0  # a guessed round trip
        predicted = ctl.model.stream_s0(4, 8, False)
        ctl.split._mode_step_s[False] = measured_keep_s * predicted
        best_lend = min(ctl.model.stream_s0(r, 8, True) for r in range(1, 8))
        best_keep = min(ctl.model.stream_s0(r, 8, False) for r in range(1, 8))
        assert 0.05 < 1 - best_lend / best_keep < 0.2  # between the band and the old prior
        return ctl.lending.pays(8, 4)

    assert decide(1.0)          # the model matched the measured step: the band is enough
    assert not decide(1.5)      # it missed by 50 %: its predicted gain is not trusted


def test_staleness_0_lends_engines_the_tail_emptied_without_migrating() -> None:
    """Streaming, staleness 0, lending mode: once a quarter of the engines have nothing left
    in the step, they go to training (idle ones first: nothing migrates) if the training
    still to do gains more than the resizes cost; not at staleness 1, not when training is
    done, not in the mode without lending."""
    def progress(staleness: int, idle: int, todo: float, lend: bool = True) -> list:
        ctl = HysteresisController(HysteresisParams())
        ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 20.0, 800.0, 300.0
        ctl.model.round_trip_s, ctl.model.round_trip_measured = 1.0, True
        ctl.model.lend_ok = lend
        v = RunView(step=3, now_s=50.0, allocation=Allocation.initial(8, 2),
                    staleness=staleness, rollout_total=100, rollout_finished=60,
                    rollout_idle=idle, train_todo=todo,
                    history=[timing(2, 100.0, 1.0, 8, 2)])
        return [(m.move, m.num_devices, m.idle_first) for m in ctl.on_rollout_progress(v)]

    assert progress(0, 3, 0.5) == [("rollout->train", 3, True)]
    assert progress(0, 1, 0.5) == []   # fewer than a quarter of the engines
    assert progress(1, 3, 0.5) == []   # staleness 1: pipelined rollouts use them
    assert progress(0, 3, 0.0) == []   # nothing left to train
    assert progress(0, 3, 0.5, lend=False) == []  # the step runs in the mode without lending


def test_a_split_that_measured_slower_is_not_chosen_again_on_the_models_word() -> None:
    """The split choice uses measured step times where a split has run (and no better than
    a split measured on the way there), the model only for the rest, scaled to the
    current split's measurement."""
    ctl = HysteresisController(HysteresisParams())
    # the model wants more rollout
    ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 1.0, 100.0, 400.0
    n, base = 16, 4
    model = ctl.split.scores(n, base, 1, step=6)
    assert min(range(1, n), key=model) > base  # the model alone would move
    ctl.split._split_step_s = {(False, 4): (10.0, 5), (False, 8): (12.0, 5)}  # 8 measured slower
    score = ctl.split.scores(n, base, 1, step=6)
    assert score(8) == 12.0 and score(12) >= 12.0  # past 8, still no better than 8
    # only the unmeasured splits short of the one that measured slower remain candidates
    assert base <= min(range(1, n), key=lambda k: (score(k), abs(k - base))) < 8


def test_pipelined_tail_time_per_engine_does_not_shrink_with_fewer_engines() -> None:
    """Pipelined rollouts: device-seconds held in a step's tail are engines waiting for their
    last requests, about the same time per engine at any width, not work. 8 engines held
    800 device-s, 600 of them in the tail (75 s each); training took 960 device-s on 8.
    Per split: max(200/R + 75, 960/(16 - R), latency 150/2 x 8/R): 120 s at R = 8, 106.7 s at
    R = 7 (11% better: one engine goes to training). Counted as work, 800/R makes R = 7
    114.3 s (5%), under the 10% a first move needs (twice the 5% band, until the rollout was
    measured at two widths): no move."""
    def decide(tail_dev_s: float) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=0.05, cost_margin=0.0))
        hist = [StepTiming(0, 150.0, 120.0, 1000, 8, 8, train_device_s=960.0,
                           rollout_device_s=800.0, rollout_tail_device_s=tail_dev_s)]
        moves = ctl.at_step_start(view(1, Allocation.initial(8, 8), hist, pipelined=True))
        assert ctl.predict_step_s(8, 16, 1) == 120.0
        return [(m.move, m.num_devices) for m in moves]

    assert decide(600.0) == [("rollout->train", 1)]
    assert decide(0.0) == []


def test_the_training_streamed_during_the_rollout_follows_when_its_work_is_ready() -> None:
    """Staleness 0: the trainers can only train groups that are complete. Work ready
    steadily through the rollout (short, even lengths) keeps them busy, so no lending is
    needed; work ready only at the end (long-tailed groups) leaves it for after the rollout,
    where lending every engine but one pays."""
    from dynaresize.control.hysteresis.model import streamed_dev_s as _streamed_dev_s

    steady = tuple((i + 1) / 10 for i in range(10))
    late = (0.0,) * 8 + (0.3, 1.0)
    # 100 s rollout, 4 trainers: 400 device-s of capacity
    assert _streamed_dev_s(steady, 1000.0, 100.0, 0.0, 4, 0) == 400.0
    assert _streamed_dev_s(steady, 200.0, 100.0, 0.0, 4, 0) == 200.0    # all of it
    assert _streamed_dev_s(late, 1000.0, 100.0, 0.0, 4, 0) == pytest.approx(80.0)
    # released engines help from the tail's start (here the last 20 s)
    assert _streamed_dev_s(late, 1000.0, 80.0, 20.0, 4, 3) == pytest.approx(80.0 + 60.0)

    def lends(profile: tuple[float, ...]) -> bool:
        ctl = HysteresisController(HysteresisParams())
        ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 2.0, 800.0, 400.0
        ctl.model.seen_steps, ctl.model.round_trip_s, ctl.model.round_trip_measured = 1, 1.0, True
        ctl.model.ready_profile = profile
        return ctl.lending.pays(8, 4)

    assert not lends(steady)
    assert lends(late)


def test_lending_needs_response_lengths_with_a_tail() -> None:
    """Staleness 0: lending is two resizes a step. With short, even response lengths
    (coefficient of variation under `lend_min_cv`) it would only time-share the devices,
    and a workload without a tail must keep one split: no lending, however much the model
    predicts. The same prediction with long-tailed lengths lends (the model's error is 0)."""
    late = (0.0,) * 8 + (0.3, 1.0)

    def lends(response_cv: float | None) -> bool:
        ctl = HysteresisController(HysteresisParams())
        ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 20.0, 800.0, 400.0
        ctl.model.seen_steps, ctl.model.round_trip_s, ctl.model.round_trip_measured = 1, 1.0, True
        ctl.model.ready_profile, ctl.model.response_cv = late, response_cv
        ctl.split._mode_step_s[False] = ctl.model.stream_s0(4, 8, False)
        return ctl.lending.pays(8, 4)

    assert lends(1.2)       # DAPO-like
    assert lends(None)      # not measured yet: the prediction decides
    assert not lends(0.15)  # `balanced`
    assert not lends(0.0)   # equal lengths (measured)
    # the controller reads the measurement from the step timings (an EMA), 0 included
    ctl = HysteresisController(HysteresisParams())
    hist = [StepTiming(0, 10.0, 5.0, 100, 4, 4, response_cv=0.0),
            StepTiming(1, 10.0, 5.0, 100, 4, 4)]  # step 1: not measured
    ctl.model.update(view(2, Allocation.initial(4, 4), hist, staleness=0))
    assert ctl.model.response_cv == 0.0


def test_a_move_the_trust_region_stopped_short_goes_on_at_staleness_0() -> None:
    """Staleness 0 (every step runs and is measured at its split): when the trust region
    stopped a move short of the model's best split, the next step may go on in the same
    direction without waiting for the dwell time; at staleness 1 it waits."""
    def moves(staleness: int) -> list[list[tuple[str, int]]]:
        ctl = HysteresisController(HysteresisParams(cost_margin=0.0, min_dwell_steps=3,
                                                    release_tail=False))
        # rollout-heavy
        ctl.model.tail_s, ctl.model.train_dev_s, ctl.model.bulk_dev_s = 0.0, 100.0, 10000.0
        ctl.model.seen_steps = 1
        hist = [timing(0, 100.0, 10.0, 4, 28)]
        out = []
        for step, r in [(1, 4), (2, 8), (3, 16)]:
            v = view(step, Allocation.initial(r, 32 - r), hist, staleness=staleness)
            out.append([(m.move, m.num_devices) for m in ctl.at_step_start(v)])
        return out

    # 4 -> 8 -> 16 -> 24 (neither stage more than doubles or halves), one step each
    assert moves(0) == [[("train->rollout", 4)], [("train->rollout", 8)],
                        [("train->rollout", 8)]]
    assert moves(1) == [[("train->rollout", 4)], [], []]   # 8, then the dwell time
