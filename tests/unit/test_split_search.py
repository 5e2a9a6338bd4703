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
