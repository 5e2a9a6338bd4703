"""The colocated baseline through the orchestrator's own loops: every device rolls out, then
trains, with the role switches between; nothing overlaps and each step uses the newest weights."""

from __future__ import annotations

import json

import pytest

from dynaresize.sim.colocated import run_colocated, switch_s
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import sim_config
from dynaresize.sim.workloads import get_workload


def test_colocated_devices_alternate_roles_step_by_step(tmp_path) -> None:  # type: ignore
    workload = get_workload("dapo-7b", seed=1, requests_per_step=32)
    costs = get_cost_model("h100-7b")
    cfg = sim_config(workload, 1, 3, 3, 0, 0, costs)
    run = run_colocated(cfg, workload, costs, out_dir=tmp_path)
    assert run.summary["num_resizes"] == 2 * 3 - 1
    metrics = run.rundir.metrics
    assert [(m["num_rollout_devices"], m["num_train_devices"]) for m in metrics] == [(4, 4)] * 3
    events = [e for e in run.rundir.events if e["kind"] != "start"]
    for device in range(4):
        mine = sorted((e for e in events if e["device"] == device), key=lambda e: e["t_start"])
        kinds = [e["kind"] for e in mine]
        step = ["rollout", "resize.to_train", "train", "weight_sync"]
        assert kinds == step + ["resize.to_rollout", "load_weights"] + step \
            + ["resize.to_rollout", "load_weights"] + step
        for a, b in zip(mine, mine[1:]):
            assert a["t_end"] <= b["t_start"] + 1e-9  # one role at a time
    switch = [e for e in events if e["kind"] == "resize.to_rollout"][0]
    load = [e for e in events if e["kind"] == "load_weights"][0]
    assert load["t_end"] - switch["t_start"] == \
        pytest.approx(switch_s(costs, 4, to_train=False))
    records = [json.loads(line) for line in open(tmp_path / "samples.jsonl")]
    assert len(records) == 3 * 32
    assert all(r["version"] == r["step"] for r in records)  # on-policy: staleness 0
