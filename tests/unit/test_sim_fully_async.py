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


def test_a_weight_update_makes_in_flight_requests_prefill_again() -> None:
    """AReaL and slime abort every request at a weight update and resubmit it with its tokens
    so far: the engine prefills the whole context again. `keep_kv` keeps it (an upper bound);
    everything else about the run is the same model, so it can only be as fast or faster."""
    wl = get_workload("dapo-7b", seed=0, requests_per_step=128)
    costs = get_cost_model("h100-7b")
    redo = run_fully_async(wl, 8, 5, 5, 2, 0, costs)
    keep = run_fully_async(wl, 8, 5, 5, 2, 0, costs, keep_kv=True)
    assert redo["kv_on_update"] == "recompute" and keep["kv_on_update"] == "keep"
    assert keep["reprefill_tokens"] == 0
    # some requests were in flight at the updates, each with at least its prompt to redo
    assert redo["reprefill_tokens"] > wl.prompt_tokens(0, 0)
    assert redo["mixed_version_share"] > 0.0  # the same requests still span the update
    assert redo["samples_per_s"] < keep["samples_per_s"]
    out = simulate("dapo-7b", 8, ("fully-async", "fully-async-keep-kv"), steps=4, staleness=1,
                   requests_per_step=64, split=5)
    assert [r["policy"] for r in out["results"]] == ["fully-async", "fully-async-keep-kv"]
    assert [r["kv_on_update"] for r in out["results"]] == ["recompute", "keep"]
