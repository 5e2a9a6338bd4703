"""Exact speculative decoding on the real path (Ray actors, builtin engine): samples and weights
are the same with speculation on and off, also when forced resizes migrate requests
mid-rollout, at staleness 0, 1 and 2 (docs/speculative.md); the run's summary reports the
acceptance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from run_views import max_param_diff, sample_view

from dynaresize.config import load_config

pytestmark = pytest.mark.ray

BASE = ["run.steps=3", "task.prompts_per_step=4", "task.samples_per_prompt=4",
        "task.max_new_tokens=24", "train.micro_batch_size=2", "output.progress='plain'",
        "rollout.max_running_requests=4", "rollout.slice_s=0.02", "resize.staging_bytes=4096",
        "rollout.speculative.forward_rows=6", "rollout.speculative.max_draft_tokens=5",
        "rollout.speculative.min_ngram=1"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.25', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=2, at='rollout:0.3', move='rollout->train', num_devices=1}]")


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_speculation_on_with_migrations_gives_the_samples_of_speculation_off(
        device_pool: Any, tmp_path: Path, staleness: int) -> None:
    off, on = tmp_path / "off", tmp_path / "on"
    run(device_pool, off, f"run.staleness={staleness}")
    summary = run(device_pool, on, f"run.staleness={staleness}", SCHEDULE,
                  "rollout.speculative.enabled=true")
    assert summary["num_resizes"] == 3
    spec = summary["speculation"]  # every device's counters, the run's acceptance
    assert spec["verify_iterations"] > 0 and spec["generated_tokens"] > 0
    assert spec["tokens_per_forward"] >= 1.0
    assert sample_view(on) == sample_view(off)
    assert max_param_diff(on, off) == 0.0
    sha = [json.loads((d / "summary.json").read_text())["param_sha256"] for d in (off, on)]
    assert sha[0] == sha[1]
