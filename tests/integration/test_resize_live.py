"""Runtime resizing on the real path (Ray actors, gloo, FSDP2): a forced schedule of resizes in
both directions, some mid-rollout with requests migrated, changes nothing a user can see."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_views import max_param_diff, sample_view

from dynaresize.config import load_config
from dynaresize.core.rundir import read_jsonl

pytestmark = pytest.mark.ray

BASE = ["run.steps=4", "run.staleness=1", "task.prompts_per_step=4", "task.samples_per_prompt=4",
        "task.max_new_tokens=24", "train.micro_batch_size=2", "output.progress='plain'",
        "rollout.max_running_requests=4", "rollout.slice_s=0.02",
        "resize.staging_bytes=4096"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.25', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=2, at='rollout:0.3', move='rollout->train', num_devices=1},"
            "{step=3, at='rollout:0.4', move='train->rollout', num_devices=1}]")


def run(pool: Any, out: Path, *overrides: str, **kwargs: Any) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices), **kwargs)






@pytest.fixture(scope="module")
def static_run(device_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("static")
    run(device_pool, out)
    return out


def test_forced_schedule_is_invisible_in_samples_and_weights(
        device_pool: Any, static_run: Path, tmp_path: Path) -> None:
    summary = run(device_pool, tmp_path, SCHEDULE)
    assert summary["num_resizes"] == 4
    assert sample_view(tmp_path) == sample_view(static_run)
    assert max_param_diff(tmp_path, static_run) < 1e-4
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert sum(m["num_resizes"] for m in metrics) == 4
    assert [(m["num_rollout_devices"], m["num_train_devices"]) for m in metrics][-1] == (3, 1)
    events = read_jsonl(tmp_path / "events.jsonl")
    resizes = [e for e in events if e["kind"] == "resize"]
    assert resizes and all(e["ok"] for e in resizes)
    assert sum(e["migrated"] for e in resizes) > 0  # mid-rollout moves migrated requests
    kinds = {e["kind"] for e in events}
    assert {"resize.export_inflight", "resize.reshard", "resize.commit",
            "resize.load_weights"} <= kinds
    assert any(e["kind"] == "resize.reshard" and e["bytes"] > 0 for e in events) or \
        any(e["kind"] == "resize" and e["bytes"] > 0 for e in events)
    # devices that trained and rolled out show it in the samples' device field
    devices = {s["device"] for s in read_jsonl(tmp_path / "samples.jsonl")}
    assert len(devices) >= 3


def test_tail_policy_is_invisible_in_samples_and_weights(
        device_pool: Any, static_run: Path, tmp_path: Path) -> None:
    """rollout.tail_policy reorders and places requests (docs/tail.md), with forced resizes
    migrating some mid-rollout: the samples and weights stay the static run's."""
    summary = run(device_pool, tmp_path, SCHEDULE, "rollout.tail_policy='spread'")
    assert summary["num_resizes"] == 4
    assert sample_view(tmp_path) == sample_view(static_run)
    assert max_param_diff(tmp_path, static_run) < 1e-4


def test_tail_spreading_is_invisible_in_samples(device_pool: Any, tmp_path: Path) -> None:
    """Staleness 0 (no pipelining): tail spreading migrates requests between engines once the
    queue is empty; the samples and weights stay those of the run without it."""
    run(device_pool, tmp_path / "off", "run.staleness=0", "run.steps=2")
    run(device_pool, tmp_path / "on", "run.staleness=0", "run.steps=2",
        "rollout.tail_policy='spread'")
    assert sample_view(tmp_path / "on") == sample_view(tmp_path / "off")
    assert max_param_diff(tmp_path / "on", tmp_path / "off") < 1e-4


def test_failed_resize_rolls_back_and_loses_nothing(
        device_pool: Any, static_run: Path, tmp_path: Path) -> None:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, SCHEDULE])
    # resize 0 fails in reshard (rolled back: 2R/2T stays), so entry 1 (train->rollout x2)
    # would empty the training pool and is skipped; resize 1 (entry 2) succeeds; resize 2
    # (entry 3) fails in load_weights on the device about to serve, and is rolled back.
    failures = {(0, "reshard"), (2, "load_weights")}
    summary = run_training(cfg, tmp_path, pool=device_pool(4),
                           fail_op=lambda index, op: (index, op.kind) in failures)
    assert summary["num_resizes"] == 1
    assert summary["num_failed_resizes"] == 2 and summary["num_skipped_resizes"] == 1
    last = read_jsonl(tmp_path / "metrics.jsonl")[-1]
    assert (last["num_rollout_devices"], last["num_train_devices"]) == (1, 3)
    assert sample_view(tmp_path) == sample_view(static_run)
    assert max_param_diff(tmp_path, static_run) < 1e-4
    failed = [e for e in read_jsonl(tmp_path / "events.jsonl")
              if e["kind"] == "resize" and not e["ok"]]
    assert failed and all("injected" in e["error"] for e in failed)
