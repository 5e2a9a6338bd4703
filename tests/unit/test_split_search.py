"""The static split search (`sim/split_search.py`): pure, over fake scores (milliseconds)."""

from __future__ import annotations

import pytest

from dynaresize.sim.split_search import estimated_mean_step_s, probe_steps, search_best_split


def _counted(fn):
    calls: list[int] = []

    def score(r: int) -> float:
        calls.append(r)
        return fn(r)
    return score, calls


@pytest.mark.parametrize("num_devices", [2, 3, 5, 16, 32, 64, 256])
@pytest.mark.parametrize("where", [0.0, 0.1, 0.47, 0.9, 1.0])
def test_finds_the_minimum_of_a_unimodal_score_wherever_it_lies(num_devices: int,
                                                                 where: float) -> None:
    """Below the grid, between grid points, at either edge: the pattern search keeps
    stepping while the best moves, so it ends at the true minimum."""
    target = max(1, min(num_devices - 1, round(where * num_devices)))
    score, calls = _counted(lambda r: abs(r - target) ** 1.5 + 0.01 * r)
    best, tried = search_best_split(score, num_devices, start=1, finest=1)
    assert best == target
    assert tried == len(calls) == len(set(calls))  # every split scored once


def test_finds_what_the_old_search_missed() -> None:
    """dapo-7b, 32 GPUs, staleness 1 (docs/results.md): the closed-form optimum (8) sits on a
    plateau, the simulated best is at 15-16. The old search probed 7, 8, 9 and stopped at 8;
    this one walks to the valley."""
    steady = {8: 527.4, 12: 390.7, 14: 347.7, 15: 337.2, 16: 331.3, 18: 348.1, 20: 404.4,
              24: 599.6, 4: 949.6}

    def score(r: int) -> float:  # piecewise linear through the measured probe scores
        known = sorted(steady)
        lo = max([k for k in known if k <= r], default=known[0])
        hi = min([k for k in known if k >= r], default=known[-1])
        if lo == hi:
            return steady[lo] + 40.0 * abs(r - lo)
        return steady[lo] + (steady[hi] - steady[lo]) * (r - lo) / (hi - lo)
    best, _ = search_best_split(score, 32, start=8)
    assert best == 16


def test_ties_go_to_fewer_rollout_devices_and_the_result_is_deterministic() -> None:
    flat = [search_best_split(lambda r: 1.0, 64, start=30) for _ in range(2)]
    assert flat[0] == flat[1] and flat[0][0] == 8  # the first grid point


def test_the_number_of_splits_scored_is_bounded() -> None:
    """A noisy score (no structure) still stops within `max_probes`."""
    score, calls = _counted(lambda r: (r * 7919) % 104729 / 104729 - 1e-6 * r)
    best, tried = search_best_split(score, 1024, start=500, max_probes=12)
    assert tried == len(calls) <= 12 and 1 <= best <= 1023


def test_refuses_fewer_than_two_devices() -> None:
    with pytest.raises(ValueError, match="num_devices = 1"):
        search_best_split(lambda r: 0.0, 1)


def test_probe_steps_cover_the_run_and_outlast_the_pipeline_fill() -> None:
    assert probe_steps(20, 1) == [0, 6, 12, 19]
    assert probe_steps(20, 0) == [0, 9, 19]
    assert probe_steps(2, 1) == [0, 1]
    # the fill step (staleness 1) once in a run of 20, the others' mean for the other 19
    assert estimated_mean_step_s([500.0, 300.0, 320.0], 1, 20) == (500 + 19 * 310) / 20
    assert estimated_mean_step_s([500.0, 300.0, 320.0], 1, 3) == 1120 / 3  # the whole run
    assert estimated_mean_step_s([500.0, 300.0], 0, 20) == 400.0
    assert estimated_mean_step_s([500.0], 1, 1) == 500.0


@pytest.mark.parametrize("num_devices", [5, 32, 256])
@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
def test_pruning_by_a_lower_bound_keeps_the_answer_and_scores_fewer(num_devices: int,
                                                                    where: float) -> None:
    """A split whose bound is above the best score found is not scored; the result is the
    one without bounds (a bumpy score, bounds at 90% of it), the splits scored a subset."""
    target = max(1, min(num_devices - 1, round(where * num_devices)))

    def fn(r: int) -> float:
        return abs(r - target) ** 1.2 + 3.0 * ((r * 37) % 5) + 10.0

    plain, plain_calls = _counted(fn)
    pruned, pruned_calls = _counted(fn)
    many: list[list[int]] = []

    def score_many(rs: list[int]) -> list[float]:
        many.append(rs)
        return [pruned(r) for r in rs]

    without = search_best_split(plain, num_devices, start=1)
    with_bound = search_best_split(pruned, num_devices, start=1,
                                   lower_bound=lambda r: 0.9 * fn(r), score_many=score_many,
                                   batch=2)
    assert with_bound[0] == without[0]
    assert set(pruned_calls) <= set(plain_calls)
    assert with_bound[1] == len(pruned_calls) <= without[1]
    assert all(len(rs) <= 2 for rs in many)


def test_a_bound_above_every_score_but_the_start_scores_only_the_start() -> None:
    score, calls = _counted(lambda r: 100.0 - r * 1e-3)
    best, tried = search_best_split(score, 64, start=30,
                                    lower_bound=lambda r: 0.0 if r == 30 else 1e9)
    assert (best, tried, calls) == (30, 1, [30])
