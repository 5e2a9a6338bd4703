"""End to end: the real Orchestrator on SimDevices in virtual time (small, fast), with golden
results pinned for fixed seeds (a change of any of them is a change of the twin's model)."""

from __future__ import annotations

import pytest

from dynaresize.control import registry as registry
from dynaresize.core.rundir import read_jsonl
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.oracle import oracle_steps
from dynaresize.sim.resolve import resolve_workload
from dynaresize.sim.run import load_policies, simulate

POLICIES = ("static", "colocated", "borrow", "oracle")
KEYS = {"policy", "split", "mean_step_s", "p99_step_s", "samples_per_s", "tokens_per_s",
        "bubble_fraction", "num_resizes"}

GOLDEN = {
    # (workload, gpus): policy -> (split, mean_step_s, num_resizes); steps=3, 64 requests, seed 1
    ("dapo-7b", 8): {"static": ((5, 3), 126.4846, 0), "colocated": ((8, 8), 127.1028, 5),
                     "borrow": ((5, 3), 126.4846, 4), "oracle": (None, 56.6828, 0)},
    ("balanced", 6): {"static": ((2, 4), 6.4361, 0), "colocated": ((6, 6), 10.4977, 5),
                      "borrow": ((2, 4), 11.2342, 6), "oracle": (None, 2.9074, 0)},
}


@pytest.mark.parametrize("workload,gpus", sorted(GOLDEN))
def test_golden_results(workload: str, gpus: int) -> None:
    out = simulate(workload, gpus=gpus, steps=3, requests_per_step=64, seed=1,
                   policies=POLICIES)
    assert (out["workload"], out["gpus"], out["steps"]) == (workload, gpus, 3)
    got = {}
    for r in out["results"]:
        assert KEYS <= set(r)
        split = (r["split"]["rollout"], r["split"]["train"]) if r["split"] else None
        got[r["policy"]] = (split, round(r["mean_step_s"], 4), r["num_resizes"])
    assert got == GOLDEN[(workload, gpus)]


def test_oracle_is_a_lower_bound_and_rows_are_sane() -> None:
    out = simulate("dapo-7b", gpus=6, steps=2, requests_per_step=32, seed=1,
                   policies=POLICIES)
    rows = {r["policy"]: r for r in out["results"]}
    assert all(rows["oracle"]["mean_step_s"] <= r["mean_step_s"] for r in rows.values())
    assert all(0.0 <= r["bubble_fraction"] < 1.0 for r in rows.values())
    assert rows["oracle"]["binds"] in ("tail-bound", "work-bound")
    assert rows["colocated"]["staleness"] == 0


def test_oracle_bounds_every_streamed_step_on_policy(tmp_path) -> None:
    """Staleness 0 with streaming training (hysteresis): every step, start to start, takes at
    least the oracle's bound for that step. A long-tailed workload on a wide pool, where most
    of the training streams during the tail (the old bound, which serialised the whole
    training after the tail, was above 2 of these 6 steps)."""
    simulate("agentic", gpus=16, steps=6, staleness=0, requests_per_step=256, seed=0,
             policies=("hysteresis",), out_dir=tmp_path)
    steps = read_jsonl(tmp_path / "hysteresis" / "metrics.jsonl")
    bounds = oracle_steps(get_cost_model("h100-7b"),
                          resolve_workload("agentic", seed=0, requests_per_step=256), 16, 6, 0)
    assert len(steps) == len(bounds) == 6
    assert all(m["step_s"] >= b.step_s for m, b in zip(steps, bounds))


def test_simulate_is_deterministic() -> None:
    a = simulate("balanced", gpus=4, steps=2, requests_per_step=32, policies=("static",))
    b = simulate("balanced", gpus=4, steps=2, requests_per_step=32, policies=("static",))
    assert a == b


def test_unknown_policy_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError,
                       match="policy .nope.: allowed: static, colocated, reference, "
                             "fully-async, fully-async-keep-kv, oracle"):
        simulate("balanced", gpus=4, steps=1, requests_per_step=32, policies=("nope",))


def test_any_registered_policy_runs_through_the_orchestrator() -> None:
    """The hook for `hysteresis` and others: register a controller, simulate it by name."""
    from dynaresize.control.base import Controller, Move, RunView

    class GrowTrainOnce(Controller):
        def __init__(self) -> None:
            self.done = False

        def at_step_start(self, view: RunView) -> list[Move]:
            if view.step == 1 and not self.done:
                self.done = True
                return [Move("rollout->train", 1)]
            return []

        def on_rollout_progress(self, view: RunView) -> list[Move]:
            return []

        def at_rollout_end(self, view: RunView) -> list[Move]:
            return []

    registry.POLICIES["test-grow"] = lambda cfg: GrowTrainOnce()
    try:
        assert "test-grow" in load_policies()
        out = simulate("balanced", gpus=6, steps=3, requests_per_step=32,
                       policies=("test-grow",), split=4)
        row = out["results"][0]
        assert row["policy"] == "test-grow" and row["num_resizes"] == 1
        assert row["split"] == {"rollout": 4, "train": 2}
    finally:
        del registry.POLICIES["test-grow"]


@pytest.mark.parametrize("kwargs,match", [
    ({"gpus": 1}, "gpus = 1"), ({"steps": 0}, "steps = 0"), ({"staleness": 9}, "staleness = 9"),
    ({"split": 6}, "split = 6"),
])
def test_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"gpus": 6, "steps": 1, "requests_per_step": 32, "policies": ("static",)} | kwargs
    with pytest.raises(ValueError, match=match):
        simulate("balanced", **args)


def test_idle_device_seconds_per_step_is_the_bubble_in_device_seconds() -> None:
    from dynaresize.core.timeline import idle_device_s_per_step

    events = [{"device": d, "t_start": 0.0, "t_end": 1.0} for d in (0, 3, 1)]
    summary = {"bubble_fraction": 0.25, "wall_s": 100.0}
    assert idle_device_s_per_step(summary, events, 5) == 0.25 * 4 * 100.0 / 5
    assert idle_device_s_per_step({"bubble_fraction": 0.0, "wall_s": 9.0}, events, 3) == 0.0


def test_reference_is_a_fixed_streaming_split_and_hysteresis_is_reported_against_it() -> None:
    """`reference`: the `fixed` policy (no resize; streaming training, pipelined rollouts) at
    its best split; the output gives hysteresis as a fraction of each row and its churn."""
    out = simulate("dapo-7b", gpus=6, steps=3, staleness=1, requests_per_step=64, seed=1,
                   policies=("static", "hysteresis", "reference", "oracle"))
    rows = {r["policy"]: r for r in out["results"]}
    assert rows["reference"]["num_resizes"] == 0 and rows["reference"]["split"]
    assert rows["reference"]["resizes_per_step"] == 0.0
    assert set(out["hysteresis_vs"]) == {"static", "reference", "oracle"}
    assert out["hysteresis_vs"]["oracle"] == pytest.approx(
        rows["hysteresis"]["samples_per_s"] / rows["oracle"]["samples_per_s"], abs=1e-3)
    churn = out["churn"]
    assert churn["versus"] == "reference"
    assert churn["resizes_per_step"] == pytest.approx(rows["hysteresis"]["num_resizes"] / 3,
                                                      abs=1e-3)
    assert churn["saved_s_per_step"] == pytest.approx(
        rows["reference"]["mean_step_s"] - rows["hysteresis"]["mean_step_s"], abs=0.01)
