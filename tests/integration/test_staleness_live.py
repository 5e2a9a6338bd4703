"""Fixed staleness 2 on the real path (Ray actors, gloo, FSDP2, CPU): every sample of step t
from version t - 2, and a forced schedule of resizes (some mid-rollout, requests migrated)
changes neither samples.jsonl nor the final parameters (issue 25); nor does pipelining the
rollouts s + 1 steps deep with packed tails."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_views import sample_view

from dynaresize.config import load_config

pytestmark = pytest.mark.ray

BASE = ["run.steps=5", "run.staleness=2", "task.prompts_per_step=4",
        "task.samples_per_prompt=4", "task.max_new_tokens=24", "train.micro_batch_size=2",
        "output.progress='plain'", "rollout.max_running_requests=4", "rollout.slice_s=0.02",
        "resize.staging_bytes=4096"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.25', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=3, at='rollout:0.3', move='rollout->train', num_devices=1},"
            "{step=4, at='rollout:0.4', move='train->rollout', num_devices=1}]")


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


def test_staleness_2_forced_schedule_same_samples_and_params(
        device_pool: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = run(device_pool, tmp_path / "plain")
    forced = run(device_pool, tmp_path / "forced", SCHEDULE)
    assert forced["num_resizes"] == 4
    view = sample_view(tmp_path / "plain")
    assert {(k[0], v[0]) for k, v in view.items()} == {(t, max(0, t - 2)) for t in range(5)}
    assert sample_view(tmp_path / "forced") == view
    assert forced["param_sha256"] == plain["param_sha256"]
    # streaming training with pipelined rollouts up to 3 steps deep (two tails) and packed
    # tails (their engines export requests to the others while the next steps start)
    deep = run(device_pool, tmp_path / "deep", "controller.policy='fixed'",
               "controller.pipeline_rollouts=true", "rollout.pack_batch=2")
    assert sample_view(tmp_path / "deep") == view
    assert deep["param_sha256"] == plain["param_sha256"]
    # controller moves while the pipeline is 3 steps deep: the resizes stop engines where
    # they are (`Resizer.deep`; their requests go back to the run that held them)
    from dynaresize.control.base import Move, RunView
    from dynaresize.control.fixed import FixedSplit
    from dynaresize.orchestrator import orchestrator

    class Moves(FixedSplit):
        def at_step_start(self, view: RunView) -> list[Move]:
            plan = {2: "train->rollout", 3: "rollout->train"}
            return [Move(plan[view.step], 1)] if view.step in plan else []

    monkeypatch.setattr(orchestrator, "make_controller", lambda cfg: Moves())
    moved = run(device_pool, tmp_path / "moved", "controller.pipeline_rollouts=true")
    assert moved["num_resizes"] == 2
    assert sample_view(tmp_path / "moved") == view
    assert moved["param_sha256"] == plain["param_sha256"]
