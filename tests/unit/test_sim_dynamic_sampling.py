"""Dynamic sampling in the twin: `FilteredWorkload` and a simulated run that keeps B groups a
step out of a prompt stream topped up live, the same records under the static split and
hysteresis."""

from __future__ import annotations

from pathlib import Path

import pytest

from dynaresize.core.rundir import read_jsonl
from dynaresize.sim.run import simulate
from dynaresize.sim.workloads import FilteredWorkload, drawn_filter_rates, get_workload


def filtered(rates, batch: int = 8, rounds: int = 3) -> FilteredWorkload:
    pool = get_workload("dapo-7b", seed=0, prompts_per_step=batch * rounds,
                        samples_per_prompt=4)
    return FilteredWorkload(pool, batch, rounds, rates)


def test_filtered_workload_draws_signals_at_the_rate() -> None:
    wl = filtered(0.4, batch=100)
    signals = [wl.group_has_signal(step, p) for step in range(5) for p in range(300)]
    assert sum(signals) / len(signals) == pytest.approx(0.6, abs=0.05)
    assert wl.prompts_per_step == 100 and wl.step_requests(0).response_tokens.shape[0] == 300
    rates = drawn_filter_rates(0.3, 0.6, 50)
    assert all(0.3 <= r <= 0.6 for r in rates) and len(set(rates)) == 50
    with pytest.raises(ValueError, match="expected 8 x 2"):
        FilteredWorkload(get_workload("dapo-7b", prompts_per_step=24), 8, 2, 0.5)


def test_twin_run_keeps_b_groups_and_records_every_group(tmp_path: Path) -> None:
    wl = filtered(drawn_filter_rates(0.3, 0.6, 6))
    simulate(wl, 8, ("static", "hysteresis", "fixed"), steps=6, staleness=1, seed=0,
             out_dir=tmp_path, cost_model="h100-7b", split=4)
    views = {}
    for policy in ("static", "hysteresis", "fixed"):
        records = read_jsonl(tmp_path / policy / "samples.jsonl")
        kept: dict[int, set[int]] = {}
        for r in records:
            if r["kept"]:
                kept.setdefault(r["step"], set()).add(r["prompt"])
        assert all(len(p) == 8 for p in kept.values()) and len(kept) == 6
        assert any(not r["kept"] for r in records)
        drawn = {r["step"]: r["prompt"] for r in records}
        assert max(drawn.values()) >= 8  # later steps drew more than one round
        # step 0 (no filter rate yet) dispatched B up front, then was topped up live
        assert max(r["prompt"] for r in records if r["step"] == 0) >= 8
        views[policy] = sorted((r["step"], r["prompt"], r["sample"], r["kept"], r["reward"])
                               for r in records)
    assert views["static"] == views["hysteresis"] == views["fixed"]  # fixed: pipelined
