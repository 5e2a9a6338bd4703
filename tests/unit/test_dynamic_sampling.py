"""The pure dynamic-sampling planner (core/dynamic_sampling.py)."""

from __future__ import annotations

import random

import pytest

from dynaresize.core.dynamic_sampling import (
    DynamicSampling,
    KeepTracker,
    TopUp,
    assemble_dynamic,
    filter_rate,
    filter_rates_of,
    has_signal,
    kept_filter_rates,
    rate_step,
    resumed_filter_rates,
    select_groups,
)
from dynaresize.core.types import Completion, RequestSpec

PLAN = DynamicSampling(groups_per_step=4, max_rounds=3, margin=0.25)


def test_initial_count_follows_the_filter_rate_within_the_stream() -> None:
    assert PLAN.pool_size == 12
    # 4 x (1 + 0.25 f) / (1 - f): 4, 5.25 -> 6, 9, 42.25 -> the stream's 12; unknown: B
    assert [PLAN.initial_for(f) for f in (None, 0.0, 0.2, 0.5, 0.9, 1.0)] == \
        [4, 4, 6, 9, 12, 12]
    assert [DynamicSampling(4, 3).initial_for(f) for f in (0.0, 0.3, 0.5)] == [4, 6, 8]


def test_rate_step_is_an_ended_step() -> None:
    assert [rate_step(k, 0) for k in range(3)] == [None, 0, 1]
    assert [rate_step(k, 1) for k in range(4)] == [None, None, 0, 1]


def test_select_keeps_the_first_groups_with_a_signal_in_seeded_order() -> None:
    order = [7, 3, 9, 1, 4, 8]
    groups = {7: [1, 1], 3: [0, 1], 9: [0, 0], 1: [1, 0], 4: [0.5, 1], 8: [1, 0]}
    kept, dropped = select_groups(order, groups, 2)
    assert (kept, dropped) == ([3, 1], [7, 9, 4, 8])
    kept, dropped = select_groups(order, groups, 4)
    assert (kept, dropped) == ([3, 1, 4, 8], [7, 9])
    # too few with a signal: the first ones without fill the batch, in order
    kept, dropped = select_groups(order, groups, 5)
    assert (kept, dropped) == ([7, 3, 1, 4, 8], [9])
    assert filter_rate(groups) == pytest.approx(2 / 6)
    assert not has_signal([0.0, 0.0]) and has_signal([0.0, 1e-9])


def test_selection_depends_on_rewards_not_on_arrival_order() -> None:
    rng = random.Random(5)
    order = list(range(12))
    groups = {p: [float(rng.random() < 0.5) for _ in range(4)] for p in order}
    reference = select_groups(order, groups, 4)
    for _ in range(20):  # the same groups finishing in any order
        items = list(groups.items())
        rng.shuffle(items)
        assert select_groups(order, dict(items), 4) == reference


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        DynamicSampling(0, 2)
    with pytest.raises(ValueError, match="rewarded groups"):
        select_groups([1, 2], {1: [0, 1]}, 1)


def test_keep_tracker_releases_exactly_the_kept_groups_in_any_completion_order() -> None:
    rng = random.Random(9)
    for trial in range(200):
        order = list(range(10, 22))
        groups = {p: [float(rng.random() < 0.4) for _ in range(3)] for p in order}
        wanted = rng.randint(1, 8)
        kept, _ = select_groups(order, groups, wanted)
        tracker = KeepTracker(order, wanted)
        finish = order[:]
        rng.shuffle(finish)
        released: list[int] = []
        for p in finish:
            new = tracker.complete(p, has_signal(groups[p]))
            assert not set(new) & set(released)
            assert set(new) <= set(kept)  # never releases a group that is not kept
            released += new
        released += tracker.seal(len(order))
        assert sorted(released) == kept, trial


def test_keep_tracker_releases_early_groups_at_once() -> None:
    tracker = KeepTracker([1, 2, 3, 4, 5, 6], 2)
    assert tracker.complete(2, True) == [2]  # at most group 1 before it: surely kept
    assert tracker.complete(5, True) == []  # 1, 3, 4 unfinished: may have a signal
    assert tracker.complete(1, False) == []  # no signal: a filler at most, known at the end
    assert tracker.complete(3, True) == [3]
    assert tracker.complete(4, True) == []  # third with a signal: dropped
    assert tracker.complete(6, False) == []
    assert tracker.seal(6) == []  # 2 and 3 were released already


def run_top_up(order: list[int], signal: dict[int, bool], wanted: int, initial: int,
               rng: random.Random) -> tuple[TopUp, KeepTracker, list[int]]:
    """Groups finish in a random order among those in flight (any timing); returns the
    top-up, a tracker fed the same completions and sealed, and what it released."""
    top_up, tracker = TopUp(order, wanted, initial), KeepTracker(order, wanted)
    in_flight, released = top_up.first(), []
    while in_flight:
        p = in_flight.pop(rng.randrange(len(in_flight)))
        in_flight += top_up.complete(p, signal[p])
        released += tracker.complete(p, signal[p])
    assert top_up.done
    return top_up, tracker, released + tracker.seal(top_up.batch_size())


def test_top_up_batch_is_a_function_of_rewards_not_of_timing() -> None:
    rng = random.Random(3)
    for trial in range(300):
        order = rng.sample(range(100), 12)
        signal = {p: rng.random() < rng.choice((0.2, 0.5, 0.9)) for p in order}
        wanted = rng.randint(1, 5)
        initial = rng.randint(wanted, 12)
        # the reference: the first N prompts, N = max(initial, first n with `wanted` signals)
        found, size = 0, len(order)
        for n, p in enumerate(order, 1):
            found += signal[p]
            if found == wanted:
                size = max(initial, n)
                break
        kept, _ = select_groups(order[:size], {p: [float(signal[p]), 0.0]
                                               for p in order[:size]}, wanted)
        for _ in range(4):
            top_up, _, released = run_top_up(order, signal, wanted, initial, rng)
            assert top_up.batch() == order[:size], trial
            assert sorted(released, key=order.index) == kept, trial
            assert top_up.num_dispatched >= size


def test_top_up_dispatches_one_prompt_per_group_without_a_signal() -> None:
    order = [10, 11, 12, 13, 14, 15, 16, 17]
    top_up = TopUp(order, 2, 3)
    assert top_up.first() == [10, 11, 12]
    assert top_up.complete(11, False) == [13]
    assert top_up.complete(10, True) == []
    assert top_up.complete(13, False) == [14]
    assert top_up.complete(14, True) == []  # 10 and 14: the batch is at most 5 prompts
    assert top_up.complete(12, False) == []  # so no more is dispatched
    assert top_up.done and top_up.batch() == [10, 11, 12, 13, 14]
    with pytest.raises(ValueError, match="initial"):
        TopUp(order, 4, 2)
    unfinished = TopUp(order, 2, 2)
    with pytest.raises(ValueError, match="unfinished"):
        unfinished.batch_size()


def test_filter_rates_from_records_equal_the_rates_the_steps_measured() -> None:
    """A resumed run plans from the rates its samples.jsonl shows (`filter_rates_of`): they
    must be those `assemble_dynamic` returned when the steps ran."""
    rng = random.Random(3)
    records, measured = [], {}
    for step in range(3):
        order = [4, 1, 0, 3, 2]
        rewards = {(p, j): float(rng.random() < 0.3) for p in order for j in range(4)}
        done = [Completion(RequestSpec(step, p, j, 0, (1,), 2, 0), [5], [0.0], "eos", 0, 0)
                for p in order for j in range(4)]
        got, measured[step] = assemble_dynamic(step, 0, order, done, rewards, 4, 2, 1.0)
        records += list(got.records)
    records.append({"step": 3, "prompt": 0, "sample": 0, "reward": 1.0})  # not dynamic
    assert filter_rates_of(records) == measured
    assert len(set(measured.values())) > 1


def test_a_resume_plans_from_the_exact_rates_its_checkpoint_kept() -> None:
    """samples.jsonl rounds rewards to 6 decimals: a group of 1 and 1 - 1e-7 had a signal
    when its step ran and shows none there; the checkpoint's exact rates win."""
    import json

    order = [0, 1, 2, 3]
    rewards = {(p, j): 1.0 - 1e-7 * (p % 2 and j == 0) for p in order for j in range(2)}
    done = [Completion(RequestSpec(0, p, j, 0, (1,), 2, 0), [5], [0.0], "eos", 0, 0)
            for p in order for j in range(2)]
    got, measured = assemble_dynamic(0, 0, order, done, rewards, 2, 2, 1.0)
    records = [json.loads(json.dumps(r)) for r in got.records]  # written, read back
    assert measured == 0.5 and filter_rates_of(records) == {0: 1.0}
    kept = kept_filter_rates({0: measured, 1: 0.25, 2: 0.75}, num_steps=3, staleness=1)
    assert kept == {"1": 0.25, "2": 0.75}  # steps 3, 4 plan from steps 1, 2
    assert resumed_filter_rates(records, {"0": measured}) == {0: measured}
    assert resumed_filter_rates(records, {}) == {0: 1.0}  # an older checkpoint: the records
