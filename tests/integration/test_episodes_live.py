"""Multi-turn episodes on the real path (Ray actors, gloo, FSDP2; `[env]`, docs/agents.md):
resizes that migrate turns mid-episode and a rollout device killed mid-rollout change nothing
in samples.jsonl or the weights, and the environment is asked exactly once per turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from run_views import max_param_diff, sample_view

from dynaresize.config import load_config
from dynaresize.core.rundir import read_jsonl

pytestmark = pytest.mark.ray

BASE = ["run.steps=3", "run.staleness=1", "task.prompts_per_step=4", "controller.policy='static'",
        "task.samples_per_prompt=4", "task.max_new_tokens=12", "train.micro_batch_size=2",
        "output.progress='plain'", "rollout.slice_s=0.02", "rollout.max_running_requests=4",
        "resize.staging_bytes=4096", "env.name='retry'", "env.max_turns=2",
        "output.record_tokens=true"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.5', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=2, at='rollout:0.4', move='rollout->train', num_devices=1}]")


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *overrides], check_machine=False)
    return run_training(cfg, out, pool=pool(cfg.num_devices))


def episode_view(path: Path) -> dict[tuple[int, int, int], Any]:
    """Each episode's record without the fields allowed to differ (devices)."""
    view = {}
    for r in read_jsonl(path / "samples.jsonl"):
        turns = [{k: v for k, v in t.items() if k != "device"} for t in r["turns"]]
        view[(r["step"], r["prompt"], r["sample"])] = (
            {k: v for k, v in r.items() if k not in ("device", "turns")}, turns)
    return view


@pytest.fixture(scope="module")
def static_run(device_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("episodes-static")
    summary = run(device_pool, out)
    assert summary["env_max_calls_per_turn"] == 1
    return out


def check_against(static: Path, out: Path) -> dict[str, Any]:
    assert sample_view(out) == sample_view(static)  # nothing lost, duplicated or changed
    assert episode_view(out) == episode_view(static)  # every turn and observation too
    assert max_param_diff(out, static) < 1e-4
    summary = json.loads((out / "summary.json").read_text())
    static_summary = json.loads((static / "summary.json").read_text())
    assert summary["param_sha256"] == static_summary["param_sha256"]  # exact reduction
    assert summary["env_max_calls_per_turn"] == 1  # no environment step repeated
    assert summary["env_calls"] == summary["turns"] == sum(
        r["num_turns"] for r in read_jsonl(out / "samples.jsonl"))
    return summary


def test_static_episodes_have_turns_observations_and_masked_training(static_run: Path) -> None:
    records = read_jsonl(static_run / "samples.jsonl")
    assert len(records) == 3 * 4 * 4
    assert any(r["num_turns"] == 2 for r in records)
    for r in records:
        assert len(r["observations"]) == r["num_turns"] - 1
        assert {t["version"] for t in r["turns"]} == {r["version"]}
        assert sum(r["loss_mask"]) == r["response_tokens"] == sum(t["tokens"]
                                                                  for t in r["turns"])
    metrics = read_jsonl(static_run / "metrics.jsonl")
    assert [m["tokens"] for m in metrics] == [
        sum(r["response_tokens"] for r in records if r["step"] == m["step"]) for m in metrics]


def test_resizes_migrating_turns_mid_episode_change_nothing(
        device_pool: Any, static_run: Path, tmp_path: Path) -> None:
    # and a slow environment (a tool that sleeps): waits change timing, never records
    summary = run(device_pool, tmp_path, SCHEDULE, "env.latency_s=0.05")
    assert summary["num_resizes"] == 3
    check_against(static_run, tmp_path)
    assert summary["env_wait_s"] >= 0.05 and summary["env_overlap_s"] >= 0.0
    resizes = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "resize"]
    assert sum(e["migrated"] for e in resizes) > 0  # turns moved mid-turn


def test_rollout_device_killed_mid_episode_loses_and_repeats_nothing(
        device_pool: Any, static_run: Path, tmp_path: Path) -> None:
    run(device_pool, tmp_path, "faults.kill=[{device=1, step=1, at='rollout:0.3'}]")
    summary = check_against(static_run, tmp_path)
    assert summary["num_faults"] == 1 and summary["faults"][0]["role"] == "rollout"
