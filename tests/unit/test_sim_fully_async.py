"""The `fully-async` reference row (issue 25): verl's / AReaL's mode in the twin, labelled as
changing the semantics, at the run's staleness bound, with speculation like every row."""

from __future__ import annotations

import pytest

from dynaresize.sim.cli import format_table
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.fully_async import run_fully_async, search_fully_async
from dynaresize.sim.run import simulate
from dynaresize.sim.workloads import get_workload


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_row_is_labelled_and_bounded(staleness: int) -> None:
    wl = get_workload("dapo-7b", seed=0, requests_per_step=64)
    costs = get_cost_model("h100-7b")
    row = run_fully_async(wl, 8, 5, 5, staleness, 0, costs)
    assert row["policy"] == "fully-async" and row["staleness"] == staleness
    assert "changed" in row["semantics"] and row["samples_per_s"] > 0
    assert 0.0 <= row["mixed_version_share"] <= 1.0
    if staleness == 0:  # nothing admitted before its own version: no sample mixes versions
        assert row["mixed_version_share"] == 0.0 and row["max_lag"] == 0
    assert row == run_fully_async(wl, 8, 5, 5, staleness, 0, costs)  # deterministic


def test_deeper_staleness_is_not_slower_and_speculation_applies() -> None:
    wl = get_workload("dapo-7b", seed=0, requests_per_step=128)
    costs = get_cost_model("h100-7b")
    rates = [run_fully_async(wl, 8, 5, 6, k, 0, costs)["samples_per_s"] for k in (0, 1, 2)]
    assert rates[0] <= rates[1] <= rates[2] * 1.02
    best, tried = search_fully_async(wl, 8, 4, 1, 0, costs)
    assert 1 <= best < 8 and tried >= 7
    out = simulate("dapo-7b", 8, ("fully-async",), steps=4, staleness=1, requests_per_step=64,
                   split=5, speculation="das")
    assert out["results"][0]["accepted_per_iteration"] > 1.0
    assert 0.0 < out["results"][0]["speculating_share"] <= 1.0
    assert "fully-async" in format_table(out).splitlines()[-1]  # `simulate`'s table prints it
