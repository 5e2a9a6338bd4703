"""Issue 5, live: the default policy (hysteresis, streaming training, exact reduction) moves
devices at runtime and changes nothing a static run with the same seed produces: the same
sample records (design §2) and, with exact reduction, the same parameters bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_views import sample_view

from dynaresize.config import load_config
from dynaresize.core.rundir import read_jsonl

pytestmark = pytest.mark.ray

SMALL = ["run.steps=6", "run.staleness=0", "task.prompts_per_step=8",
         "task.samples_per_prompt=4", "task.max_new_tokens=24", "train.micro_batch_size=4",
         "controller.hysteresis.min_dwell_steps=1", "controller.hysteresis.cost_margin=0.5",
         "controller.hysteresis.tail_batch=2", "output.progress='plain'"]


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*SMALL, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


UNBALANCED = ["allocation.num_rollout_devices=1", "allocation.num_train_devices=3",
              "controller.hysteresis.horizon_steps=20"]
"""One engine for a rollout-bound step: a split change pays whatever the machine's load (on
2 balanced devices each the controller may rightly keep the split when timings are noisy)."""


def test_hysteresis_resizes_and_changes_nothing(device_pool: Any, tmp_path: Path) -> None:
    hyst = run(device_pool, tmp_path / "h", *UNBALANCED)
    static = run(device_pool, tmp_path / "s", *UNBALANCED, "controller.policy='static'")
    assert hyst["num_resizes"] >= 1 and static["num_resizes"] == 0
    assert sample_view(tmp_path / "h") == sample_view(tmp_path / "s")
    assert hyst["param_sha256"] == static["param_sha256"]
    resized_steps = [m["step"] for m in read_jsonl(tmp_path / "h" / "metrics.jsonl")
                     if m["num_resizes"]]
    assert resized_steps, "the hysteresis run recorded no resize in its metrics"


def test_pipelined_rollouts_live_change_nothing(device_pool: Any, tmp_path: Path) -> None:
    """Staleness 1 (the default's): the next step's rollout starts on engines the tail
    emptied or packed (real actors: each loads the newer version; a packed engine's requests
    continue on another from their exported state), and the samples and parameters equal a
    static run's. `rollout.pack_batch` = 32 packs this small tail as soon as it hands off."""
    piped = run(device_pool, tmp_path / "p", "run.staleness=1", "run.steps=5",
                "rollout.pack_batch=32")
    static = run(device_pool, tmp_path / "s", "run.staleness=1", "run.steps=5",
                 "controller.policy='static'")
    assert sample_view(tmp_path / "p") == sample_view(tmp_path / "s")
    assert piped["param_sha256"] == static["param_sha256"]
    spans: dict[int, list[float]] = {}
    for e in read_jsonl(tmp_path / "p" / "events.jsonl"):
        if e["kind"] == "rollout":
            span = spans.setdefault(e["step"], [e["t_start"], e["t_end"]])
            span[0], span[1] = min(span[0], e["t_start"]), max(span[1], e["t_end"])
    assert any(spans[k + 1][0] < spans[k][1] for k in range(4)), "no step overlapped"
