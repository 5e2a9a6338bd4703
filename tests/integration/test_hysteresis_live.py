"""Issue 5, live: the default policy (hysteresis, streaming training, exact reduction) moves
devices at runtime and changes nothing a static run with the same seed produces: the same
sample records (DESIGN §2) and, with exact reduction, the same parameters bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_views import sample_view

from dynaresize.config import load_config
from dynaresize.rundir import read_jsonl

pytestmark = pytest.mark.ray

SMALL = ["run.steps=6", "run.staleness=0", "task.prompts_per_step=8",
         "task.samples_per_prompt=4", "task.max_new_tokens=24", "train.micro_batch_size=4",
         "controller.min_dwell_steps=1", "controller.cost_margin=0.5",
         "controller.tail_batch=2", "output.progress='plain'"]


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.runner import run_training

    cfg = load_config(None, [*SMALL, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


def test_hysteresis_resizes_and_changes_nothing(device_pool: Any, tmp_path: Path) -> None:
    hyst = run(device_pool, tmp_path / "h")
    static = run(device_pool, tmp_path / "s", "controller.policy='static'")
    assert hyst["num_resizes"] >= 1 and static["num_resizes"] == 0
    assert sample_view(tmp_path / "h") == sample_view(tmp_path / "s")
    assert hyst["param_sha256"] == static["param_sha256"]
    resized_steps = [m["step"] for m in read_jsonl(tmp_path / "h" / "metrics.jsonl")
                     if m["num_resizes"]]
    assert resized_steps, "the hysteresis run recorded no resize in its metrics"
