"""End to end: the real Orchestrator on SimDevices in virtual time (small, fast)."""

from __future__ import annotations

from dynaresize.sim.run import simulate


def test_simulate_small_json_shape_and_oracle_below_static() -> None:
    out = simulate("dapo-7b", gpus=6, steps=2, requests_per_step=32, seed=1)
    assert out["workload"] == "dapo-7b" and out["gpus"] == 6 and out["steps"] == 2
    rows = {r["policy"]: r for r in out["results"]}
    assert set(rows) == {"static", "oracle"}
    keys = {"policy", "split", "mean_step_s", "p99_step_s", "samples_per_s", "tokens_per_s",
            "bubble_fraction", "num_resizes"}
    assert all(keys <= set(r) for r in rows.values())
    split = rows["static"]["split"]
    assert split["rollout"] + split["train"] == 6 and split["rollout"] >= 1
    assert rows["oracle"]["mean_step_s"] <= rows["static"]["mean_step_s"]
    assert 0.0 <= rows["static"]["bubble_fraction"] < 1.0


def test_simulate_is_deterministic() -> None:
    a = simulate("balanced", gpus=4, steps=2, requests_per_step=32, policies=("static",))
    b = simulate("balanced", gpus=4, steps=2, requests_per_step=32, policies=("static",))
    assert a == b
