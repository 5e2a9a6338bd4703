"""The hysteresis controller is pure: decisions from synthetic RunViews, in milliseconds.

One test (or more) per rule of docs/controller.md; each fails with its rule disabled."""

from __future__ import annotations

from collections import deque

import pytest

from dynaresize.control.base import RunView, StepTiming
from dynaresize.control.hysteresis.controller import HysteresisController, HysteresisParams
from dynaresize.control.hysteresis.model import streamed_dev_s
from dynaresize.control.hysteresis.split import deep_donor_region, donor_region, trust_region
from dynaresize.control.rollout_width import width_slope
from dynaresize.core.allocation import Allocation


def view(step: int, alloc: Allocation, history: list[StepTiming], staleness: int = 1,
         **kw: object) -> RunView:
    return RunView(step=step, now_s=100.0 * step, allocation=alloc, staleness=staleness,
                   history=history, **kw)  # type: ignore[arg-type]


def timing(step: int, rollout_s: float, train_s: float, r: int, t: int) -> StepTiming:
    return StepTiming(step, rollout_s, train_s, 1000, r, t)


def pairs(moves: list) -> list[tuple[str, int]]:
    return [(m.move, m.num_devices) for m in moves]


def test_moves_devices_to_the_slower_stage_once_and_then_dwells() -> None:
    ctl = HysteresisController(HysteresisParams(min_dwell_steps=3, cost_margin=0.0))
    alloc = Allocation.initial(2, 6)          # rollout starved: 100 s vs train 10 s
    hist = [timing(0, 100.0, 10.0, 2, 6)]
    moves = ctl.at_step_start(view(1, alloc, hist))
    # 200 rollout device-s, 60 train device-s: max(200/R, 60/(8-R)) is least at R = 6; at
    # staleness 1 the rollout may more than double, but the training keeps half: R = 5
    assert pairs(moves) == [("train->rollout", 3)]
    # right after a change, the dwell time forbids another one even if estimates move
    hist.append(timing(1, 20.0, 80.0, 7, 1))
    assert ctl.at_step_start(view(2, Allocation.initial(7, 1), hist)) == []


def test_one_move_at_most_doubles_or_halves_either_stage() -> None:
    """The model is fitted at the current split; far from it its shape is a guess (at 128
    GPUs it once sent every trainer but one to the rollout)."""
    assert trust_region(128, 25) == (13, 50)   # R <= 50 (T >= 52)
    assert trust_region(8, 2) == (1, 4)
    assert trust_region(8, 6) == (4, 7)        # T <= 4
    # staleness >= 1: only the stage that gives devices keeps half (the model bounds the rest)
    assert donor_region(8, 2) == (1, 5)
    assert donor_region(128, 25) == (13, 76)
    # staleness >= 2: it keeps three quarters (a move applies at once), one device always
    assert deep_donor_region(40, 15) == (12, 21)   # R >= 12, T >= 19
    assert deep_donor_region(32, 15) == (12, 19)
    assert deep_donor_region(8, 2) == (1, 3)       # a quarter of 2 rounds to none: one moves
    assert deep_donor_region(4, 3) == (2, 3)


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
    def moves(band: float) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=band, cost_margin=0.0))
        hist = [timing(0, 50.0, 46.0, 32, 32)]   # 33R/31T: 48.5 s, 3% better than 50 s
        return pairs(ctl.at_step_start(view(1, Allocation.initial(32, 32), hist)))

    assert moves(0.1) == []
    assert moves(0.0) == [("train->rollout", 1)]


def test_a_first_move_on_one_measured_width_needs_one_and_a_half_bands() -> None:
    """Staleness >= 1: while the rollout was measured at one width only, the model's shape
    in the width is a guess and a move disrupts the pipeline once (unseen tailless run 17:
    a 5.1% promise gained nothing and cost a 42 s step among 28 s ones). There a move must
    promise 1.5 bands; once two widths were measured, one band."""
    def moves(hist: list[StepTiming], staleness: int = 1) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=0.05, cost_margin=0.0))
        r = hist[-1].num_rollout_devices
        return pairs(ctl.at_step_start(view(len(hist), Allocation.initial(r, 16 - r), hist,
                                            staleness=staleness)))

    # 8R/8T: max(640 rollout device-s / R, 780 training device-s / (16 - R)) is 97.5 s now,
    # 91.4 s at R = 7 (6.2% better: over one band, under 1.5)
    one_width = [timing(0, 80.0, 97.5, 8, 8)]
    assert moves(one_width) == []
    two_widths = [timing(0, 640.0 / 7, 780.0 / 9, 7, 9), timing(1, 80.0, 97.5, 8, 8)]
    assert moves(two_widths) == [("rollout->train", 1)]


def test_cost_gate_blocks_moves_that_do_not_pay_off() -> None:
    ctl = HysteresisController(HysteresisParams(band=0.0, horizon_steps=1, cost_margin=10.0))
    alloc = Allocation.initial(4, 4)
    hist = [timing(0, 60.0, 40.0, 4, 4)]
    expensive = view(1, alloc, hist, resize_critical_s=[50.0])
    assert ctl.at_step_start(expensive) == []
    cheap = HysteresisController(HysteresisParams(band=0.0, horizon_steps=1, cost_margin=10.0))
    assert cheap.at_step_start(view(1, alloc, hist, resize_critical_s=[0.1])) != []


def test_before_a_resize_was_measured_a_move_costs_a_share_of_the_step() -> None:
    """Until a resize was measured, a split move is charged 5% of the last step: a run
    whose steps last a second moves (a fixed guess in seconds would block it), and a
    move promising under that share over the horizon waits."""
    def moves(rollout_s: float, train_s: float, r: int) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=0.0, horizon_steps=1,
                                                    cost_margin=1.0))
        return pairs(ctl.at_step_start(view(1, Allocation.initial(r, r),
                                            [timing(0, rollout_s, train_s, r, r)])))

    assert moves(1.0, 0.2, 2) == [("train->rollout", 1)]   # 0.33 s saved of a 1.2 s step
    # 8R/8T: 9R/7T saves 0.086 s (8.6%), under 5% of the 1.8 s step: no move
    assert moves(1.0, 0.8, 8) == []


def test_estimates_are_smoothed_over_steps() -> None:
    """The estimates are EMAs (weight 0.5): one outlier step moves them halfway."""
    ctl = HysteresisController(HysteresisParams())
    hist = [timing(0, 100.0, 10.0, 4, 4), timing(1, 300.0, 10.0, 4, 4)]
    ctl.model.update(view(2, Allocation.initial(4, 4), hist))
    assert ctl.model.rollout_dev_s == pytest.approx(800.0)   # (400 + 1200) / 2


def test_a_change_of_lending_mode_replans_the_split_within_the_dwell_time() -> None:
    """The split was chosen for the lending mode: when the mode changes, the split is
    re-planned at once, whatever the dwell time."""
    ctl = HysteresisController(HysteresisParams(cost_margin=0.0, min_dwell_steps=100))
    ctl.model.rollout_dev_s, ctl.model.train_dev_s = 400.0, 800.0
    ctl.model.seen_steps, ctl.model.response_cv = 1, 1.0
    ctl.model.ready_profile = (0.0,) * 8 + (0.3, 1.0)
    ctl._last_change_step = 0
    hist = [timing(0, 100.0, 100.0, 4, 4)]
    v = RunView(step=1, now_s=0.0, allocation=Allocation.initial(4, 4), staleness=0,
                history=hist, resize_wall_s=[1.0], resize_critical_s=[1.0])
    moves = ctl.at_step_start(v)
    assert ctl.model.lend_ok and moves != []


def test_staleness_0_predicts_the_training_streamed_through_the_rollout() -> None:
    """Staleness 0 with streaming: the trainers train the groups completed during the
    rollout; without streaming the stages add up. Streaming predicts the shorter step and
    moves its best split towards the rollout."""
    ctl = HysteresisController(HysteresisParams(release_tail=False))
    ctl.model.rollout_dev_s, ctl.model.train_dev_s = 300.0, 200.0
    ctl.model.ready_profile = tuple((i + 1) / 10 for i in range(10))
    serial = HysteresisController(HysteresisParams(release_tail=False))
    serial.streams_training = False
    serial.model.rollout_dev_s, serial.model.train_dev_s = 300.0, 200.0
    # without streaming: 300/R + 200/(8-R), least at R = 4 (125 s)
    assert min(range(1, 8), key=lambda r: serial.predict_step_s(r, 8, 0)) == 4
    best = min(range(1, 8), key=lambda r: ctl.predict_step_s(r, 8, 0))
    assert best > 4 and ctl.predict_step_s(best, 8, 0) < serial.predict_step_s(4, 8, 0)


def test_the_training_streamed_during_the_rollout_follows_when_its_work_is_ready() -> None:
    """Staleness 0: the trainers can only train groups that are complete. Work ready
    steadily through the rollout (short, even lengths) keeps them busy, so no lending is
    needed; work ready only at the end (long-tailed groups) leaves it for after the rollout,
    where lending every engine but one pays."""
    steady = tuple((i + 1) / 10 for i in range(10))
    late = (0.0,) * 8 + (0.3, 1.0)
    # 100 s rollout, 4 trainers: 400 device-s of capacity
    assert streamed_dev_s(steady, 1000.0, 100.0, 4) == 400.0
    assert streamed_dev_s(steady, 200.0, 100.0, 4) == 200.0    # all of it
    assert streamed_dev_s(late, 1000.0, 100.0, 4) == pytest.approx(80.0)

    def lends(profile: tuple[float, ...]) -> bool:
        ctl = HysteresisController(HysteresisParams())
        ctl.model.rollout_dev_s, ctl.model.train_dev_s = 400.0, 800.0
        ctl.model.round_trip_s = 1.0
        ctl.model.ready_profile = profile
        return ctl.lending.pays(8)

    assert not lends(steady)
    assert lends(late)


def lending_controller(response_cv: float | None = 1.2, band: float = 0.05,
                       round_trip_s: float = 1.0) -> HysteresisController:
    """Lending predicted to pay (late-ready training, 8 devices)."""
    ctl = HysteresisController(HysteresisParams(band=band))
    ctl.model.rollout_dev_s, ctl.model.train_dev_s = 800.0, 400.0
    ctl.model.round_trip_s = round_trip_s
    ctl.model.ready_profile, ctl.model.response_cv = (0.0,) * 8 + (0.3, 1.0), response_cv
    return ctl


def test_lending_needs_response_lengths_with_a_tail() -> None:
    """Staleness 0: lending is two resizes a step. With short, even response lengths
    (coefficient of variation under `lend_min_cv`) it would only time-share the devices,
    and a workload without a tail must keep one split: no lending, however much the model
    predicts."""
    assert lending_controller(1.2).lending.pays(8)       # DAPO-like
    assert lending_controller(None).lending.pays(8)      # not measured yet: the prediction
    assert not lending_controller(0.15).lending.pays(8)  # `balanced`
    assert not lending_controller(0.0).lending.pays(8)   # equal lengths (measured)
    # the controller reads the measurement from the step timings (an EMA), 0 included
    ctl = HysteresisController(HysteresisParams())
    hist = [StepTiming(0, 10.0, 5.0, 100, 4, 4, response_cv=0.0),
            StepTiming(1, 10.0, 5.0, 100, 4, 4)]  # step 1: not measured
    ctl.model.update(view(2, Allocation.initial(4, 4), hist, staleness=0))
    assert ctl.model.response_cv == 0.0


def test_release_tail_off_never_lends() -> None:
    """`controller.hysteresis.release_tail = false`: no lending mode, no lends."""
    ctl = lending_controller()
    ctl.p.release_tail = False
    v = RunView(step=1, now_s=0.0, allocation=Allocation.initial(4, 4), staleness=0,
                history=[timing(0, 200.0, 100.0, 4, 4)], resize_wall_s=[1.0])
    ctl.model.seen_steps = 1
    ctl.at_step_start(v)
    assert not ctl.model.lend_ok
    ctl.model.lend_ok = True
    assert ctl.at_rollout_end(lend_view()) == []
    assert lending_controller().lending.pays(8)   # the same workload would lend


def test_lending_must_beat_never_lending_by_the_band() -> None:
    model = lending_controller().model
    gain = 1 - (min(model.stream_s0(r, 8, True) for r in range(1, 8))
                / min(model.stream_s0(r, 8, False) for r in range(1, 8)))
    assert 0.1 < gain < 0.9
    assert lending_controller(band=gain - 0.01).lending.pays(8)
    assert not lending_controller(band=gain + 0.01).lending.pays(8)


def lend_view(staleness: int = 0, todo: float = 0.8, r: int = 4, **kw: object) -> RunView:
    return RunView(step=3, now_s=50.0, allocation=Allocation.initial(r, 4),
                   staleness=staleness, rollout_total=100, rollout_finished=100,
                   train_todo=todo, history=[timing(2, 100.0, 1.0, r, 4)],
                   **kw)  # type: ignore[arg-type]


def lender(lend: bool = True, round_trip_s: float = 1.0) -> HysteresisController:
    ctl = HysteresisController(HysteresisParams())
    ctl.model.rollout_dev_s, ctl.model.train_dev_s = 300.0, 800.0
    ctl.model.round_trip_s, ctl.model.lend_ok = round_trip_s, lend
    return ctl


def test_lending_at_rollout_end_and_return_next_step() -> None:
    """Staleness 0, lending mode: at rollout end every engine but one trains (idle ones
    first: nothing migrates); they come back at the next step start (blocking at staleness
    0: before the rollout). Not at staleness 1, not when training is done, not in the mode
    without lending; never during the rollout."""
    def end(**kw: object) -> list[tuple[str, int, bool]]:
        lend = bool(kw.pop("lend", True))
        moves = lender(lend).at_rollout_end(lend_view(**kw))  # type: ignore[arg-type]
        return [(m.move, m.num_devices, m.idle_first) for m in moves]

    assert end() == [("rollout->train", 3, True)]
    assert end(staleness=1) == []    # staleness 1: pipelined rollouts use the engines
    assert end(todo=0.0) == []       # nothing left to train
    assert end(lend=False) == []     # the step runs in the mode without lending
    ctl = lender()
    assert ctl.on_rollout_progress(lend_view(rollout_idle=3)) == []
    assert pairs(ctl.at_rollout_end(lend_view())) == [("rollout->train", 3)]
    hist = [timing(2, 100.0, 1.0, 4, 4)]
    back = ctl.at_step_start(RunView(step=4, now_s=60.0, allocation=Allocation.initial(1, 7),
                                     staleness=0, history=hist, num_pending_resizes=1))
    assert [(m.move, m.num_devices, m.blocking) for m in back] == [("train->rollout", 3, True)]


def test_a_lend_must_gain_more_than_its_round_trips() -> None:
    assert pairs(lender(round_trip_s=1.0).at_rollout_end(lend_view())) \
        == [("rollout->train", 3)]
    assert lender(round_trip_s=100.0).at_rollout_end(lend_view()) == []
    # before a resize was measured, `resize_guess_s` is the round trip
    ctl = HysteresisController(HysteresisParams(resize_guess_s=100.0))
    ctl.model.update(lend_view())
    assert ctl.model.round_trip_s == 100.0


def test_pipelined_tail_time_per_engine_does_not_shrink_with_fewer_engines() -> None:
    """Pipelined rollouts: device-seconds held in a step's tail are engines waiting for their
    last requests, about the same time per engine at any width, not work. 8 engines held
    800 device-s, 600 of them in the tail (75 s each); training took 960 device-s on 8.
    Per split: max(200/R + 75, 960/(16 - R)): 120 s at R = 8, 106.7 s at R = 7 (11% better:
    one engine goes to training). Counted as work, 800/R makes R = 7 114.3 s (4.8%), under
    the 5% band: no move."""
    def decide(tail_dev_s: float) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=0.05, cost_margin=0.0))
        hist = [StepTiming(0, 150.0, 120.0, 1000, 8, 8, train_device_s=960.0,
                           rollout_device_s=800.0, rollout_tail_device_s=tail_dev_s)]
        moves = ctl.at_step_start(view(1, Allocation.initial(8, 8), hist, pipelined=True))
        assert ctl.predict_step_s(8, 16, 1) == 120.0
        return pairs(moves)

    assert decide(600.0) == [("rollout->train", 1)]
    assert decide(0.0) == []



def test_staleness_2_charges_no_tail_seconds_per_engine() -> None:
    """Staleness >= 2: a step's tail runs beside the s later steps' runs (the pipeline is
    s + 1 deep), so its seconds per engine are not on the step's pace (`DEEP_TAIL_SHARE`).
    The numbers above: at staleness 1, max(200/R + 75, 960/(16 - R)) moves one engine; at
    staleness 2, max(200/R, 960/(16 - R)) is 80 s at R = 4, 120 s now, but one change
    leaves the donor three quarters (`deep_donor_region`): two engines go to training
    (96 s at R = 6)."""
    def decide(staleness: int) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=0.05, cost_margin=0.0))
        hist = [StepTiming(0, 150.0, 120.0, 1000, 8, 8, train_device_s=960.0,
                           rollout_device_s=800.0, rollout_tail_device_s=600.0)]
        moves = ctl.at_step_start(view(staleness + 1, Allocation.initial(8, 8), hist,
                                       staleness=staleness, pipelined=True))
        assert ctl.predict_step_s(4, 16, staleness) == (80.0 if staleness == 2 else 125.0)
        return pairs(moves)

    assert decide(1) == [("rollout->train", 1)]
    assert decide(2) == [("rollout->train", 2)]


def test_training_in_few_whole_micro_batches_is_not_sped_up_by_more_trainers() -> None:
    """A micro-batch trains on one trainer: 16 of 100 s each take two rounds on 8 to 15
    trainers alike (200 s) and one on 16 (`StageModel.train_s`). Spread over the trainers
    (1600 device-s / T), two engines moved to training would cut the step from 200 to 160 s
    (the rollout then 800 / 6 = 133 s); counted whole no move helps. With 40 micro-batches
    (5 rounds on 8 trainers) they are spread again (`WHOLE_ROUNDS_MAX`)."""
    def decide(num_micro_batches: int) -> list[tuple[str, int]]:
        ctl = HysteresisController(HysteresisParams(band=0.05, cost_margin=0.0))
        hist = [StepTiming(0, 100.0, 200.0, 1000, 8, 8, train_device_s=1600.0,
                           num_micro_batches=num_micro_batches)]
        moves = pairs(ctl.at_step_start(view(1, Allocation.initial(8, 8), hist)))
        assert ctl.predict_step_s(8, 16, 1) == 200.0
        return moves

    assert decide(16) == []
    assert decide(40) == [("rollout->train", 2)]
    assert decide(0) == decide(40)  # not measured: spread
