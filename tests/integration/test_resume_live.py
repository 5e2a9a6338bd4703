"""Checkpoint and resume on the real path: a run stopped after step 3 (last checkpoint after
step 2) and resumed with 3 instead of 2 training devices ends with the same samples and, within
1e-4, the same parameters as an uninterrupted run (DCP loads into the new sharding)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from run_views import max_param_diff, sample_view

from dynaresize.config import load_config
from dynaresize.core.rundir import read_jsonl

pytestmark = pytest.mark.ray

BASE = ["run.steps=4", "run.staleness=1", "task.prompts_per_step=4", "controller.policy='static'",
        "task.samples_per_prompt=4", "task.max_new_tokens=12", "train.micro_batch_size=2",
        "output.progress='plain'", "rollout.slice_s=0.05"]






def test_stop_and_resume_with_more_train_devices(device_pool: Any, tmp_path: Path) -> None:
    from dynaresize.app.runner import RunStopped, run_training
    from dynaresize.orchestrator.checkpoint_files import read_latest

    pool = device_pool(4)
    full = tmp_path / "full"
    run_training(load_config(None, BASE, check_machine=False), full, pool=pool)

    cut = tmp_path / "cut"
    with pytest.raises(RunStopped):
        cfg = load_config(None, [*BASE, "run.checkpoint_every=2"], check_machine=False)
        run_training(cfg, cut, pool=pool, stop_after_steps=3)
    path, state = read_latest(cut)
    assert state.num_steps == 2 and state.weight_files == {"1": "weights-v1.pt"}
    assert any((path / "train").glob("*.distcp"))
    assert max(m["step"] for m in read_jsonl(cut / "metrics.jsonl")) == 2

    resumed = load_config(None, [*BASE, "run.checkpoint_every=2",
                                 "allocation.num_rollout_devices=1",
                                 "allocation.num_train_devices=3"], check_machine=False)
    summary = run_training(resumed, cut, pool=pool, resume=True)
    assert summary["steps"] == 4
    assert [m["step"] for m in read_jsonl(cut / "metrics.jsonl")] == [0, 1, 2, 3]
    assert [m["num_train_devices"] for m in read_jsonl(cut / "metrics.jsonl")] == [2, 2, 3, 3]
    assert sample_view(cut) == sample_view(full)
    assert max_param_diff(cut, full) < 1e-4
    events = read_jsonl(cut / "events.jsonl")
    assert {"checkpoint", "restore"} <= {e["kind"] for e in events}
    assert read_latest(cut)[1].num_steps == 4
    assert json.loads((cut / "summary.json").read_text())["steps"] == 4
