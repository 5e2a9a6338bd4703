"""Fixed staleness k >= 2 (issue 25): every sample of step t from version t - k exactly,
whatever the allocation and its resizes, in the twin (virtual time); the version store keeps
k + 1 versions; the config names what it allows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dynaresize.config import load_config
from dynaresize.config.schema import ConfigError
from dynaresize.orchestrator.state import VersionStore, sample_version
from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.harness import run_config, workload_for_config
from dynaresize.sim.run import simulate

BASE = ["run.steps=6", "task.prompts_per_step=4", "task.samples_per_prompt=4",
        "task.max_new_tokens=16", "train.micro_batch_size=2", "output.progress='plain'",
        "rollout.max_running_requests=8", "rollout.slice_s=0.02", "resize.staging_bytes=4096"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.5', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=3, at='rollout:0.3', move='rollout->train', num_devices=1},"
            "{step=4, at='rollout:0.4', move='train->rollout', num_devices=1}]")


def records(path: Path) -> dict[tuple[int, int, int], tuple[int, int]]:
    rows = [json.loads(x) for x in (path / "samples.jsonl").read_text().splitlines()]
    view = {(r["step"], r["prompt"], r["sample"]): (r["version"], r["response_tokens"])
            for r in rows}
    assert len(view) == len(rows)
    return view


def test_sample_version_and_store_keeps_k_plus_one() -> None:
    assert [sample_version(t, 2) for t in range(5)] == [0, 0, 0, 1, 2]

    async def go() -> list[bool]:
        store = VersionStore(keep=3)
        for v in range(1, 6):
            await store.publish(v, v)
        return [store.has(v) for v in range(6)]

    assert asyncio.run(go()) == [False, False, False, True, True, True]


@pytest.mark.parametrize("bad", ["-1", "9", "true"])
def test_staleness_out_of_range_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="run.staleness"):
        load_config(None, [*BASE, f"run.staleness={bad}"], check_machine=False)


@pytest.mark.parametrize("policy", ["static", "hysteresis"])
def test_staleness_2_records_independent_of_resizes(tmp_path: Path, policy: str) -> None:
    costs = get_cost_model("h100-7b")
    runs = {}
    for name, extra in (("plain", []), ("forced", [SCHEDULE]),
                        ("split", ["allocation.num_rollout_devices=1",
                                   "allocation.num_train_devices=3"])):
        cfg = load_config(None, [*BASE, "run.staleness=2", f"controller.policy='{policy}'",
                                 *extra], check_machine=False)
        run = run_config(cfg, workload_for_config(cfg, "dapo-7b"), costs,
                         out_dir=tmp_path / name)
        runs[name] = records(tmp_path / name)
        if name == "forced":
            assert run.summary["num_resizes"] == 4
    assert runs["plain"] == runs["forced"] == runs["split"]
    assert {(k[0], v[0]) for k, v in runs["plain"].items()} == {
        (t, sample_version(t, 2)) for t in range(6)}


def test_simulate_staleness_2_every_policy() -> None:
    out = simulate("dapo-7b", 8, ("static", "hysteresis", "reference", "oracle"), steps=5,
                   staleness=2, requests_per_step=64)
    assert out["staleness"] == 2
    assert all(r["samples_per_s"] > 0 for r in out["results"])
    oracle = next(r for r in out["results"] if r["policy"] == "oracle")
    assert all(r["samples_per_s"] <= oracle["samples_per_s"] for r in out["results"])


def test_staleness_2_checkpoint_and_a_trainer_death_keep_the_records(tmp_path: Path) -> None:
    costs = get_cost_model("h100-7b")
    views = []
    for name, extra in (("plain", []), ("killed", [
            "run.checkpoint_every=1", "faults.kill=[{device=3, step=3, at='train'}]"])):
        cfg = load_config(None, [*BASE, "run.staleness=2", *extra], check_machine=False)
        run = run_config(cfg, workload_for_config(cfg, "dapo-7b"), costs,
                         out_dir=tmp_path / name)
        views.append(records(tmp_path / name))
        if name == "killed":
            assert run.summary["num_faults"] == 1 and run.summary["faults"][0]["restored"]
    assert views[0] == views[1]
