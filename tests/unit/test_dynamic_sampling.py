"""The pure dynamic-sampling planner (core/dynamic_sampling.py)."""

from __future__ import annotations

import random

import pytest

from dynaresize.core.dynamic_sampling import (
    DynamicSampling,
    certain_shortfall,
    filter_rate,
    has_signal,
    rate_step,
    select_groups,
)

PLAN = DynamicSampling(groups_per_step=4, max_rounds=3, margin=0.25)


def test_rounds_follow_the_filter_rate_within_the_cap() -> None:
    assert PLAN.pool_size == 12
    # (1 + 0.25) / (1 - f): 1.25 -> 2 rounds, 0.5 -> 2.5 -> 3, 0.9 -> 12.5 -> cap 3
    assert [PLAN.rounds_for(f) for f in (None, 0.0, 0.2, 0.5, 0.9, 1.0)] == [1, 2, 2, 3, 3, 3]
    assert DynamicSampling(4, 5, margin=0.0).rounds_for(0.0) == 1
    assert PLAN.round_prompts(list(range(100, 112)), 2) == list(range(100, 108))
    with pytest.raises(ValueError, match="rounds"):
        PLAN.round_prompts(list(range(12)), 4)


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


def test_certain_shortfall() -> None:
    # 8 groups drawn, 4 wanted: 4 may lack a signal; the 5th without one decides it
    assert not certain_shortfall(8, 4, 4)
    assert certain_shortfall(8, 5, 4)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        DynamicSampling(0, 2)
    with pytest.raises(ValueError, match="rewarded groups"):
        select_groups([1, 2], {1: [0, 1]}, 1)


def test_keep_tracker_releases_exactly_the_kept_groups_in_any_completion_order() -> None:
    from dynaresize.core.dynamic_sampling import KeepTracker

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
        assert sorted(released) == kept, trial


def test_keep_tracker_releases_early_groups_at_once() -> None:
    from dynaresize.core.dynamic_sampling import KeepTracker

    tracker = KeepTracker([1, 2, 3, 4, 5, 6], 2)
    assert tracker.complete(2, True) == [2]  # at most group 1 before it: surely kept
    assert tracker.complete(5, True) == []  # 1, 3, 4 unfinished: may have a signal
    assert tracker.complete(1, False) == []  # no signal: a filler at most, known at the end
    assert tracker.complete(3, True) == [3]
    assert tracker.complete(4, True) == []  # third with a signal: dropped
    assert tracker.complete(6, False) == []
