"""Live (Ray actors, gloo): token-budgeted micro-batches (`train.max_tokens_per_micro_batch`)
change nothing a run's contract fixes. Hysteresis (streaming training: each group cut when it
completes, sparse slot indices; resizes if the run's timings call for them) and static (the
LPT-balanced plan through `train_step`) with the same budget and seed write the same sample
records and end with the same parameters bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from run_views import sample_view
from test_hysteresis_live import run

from dynaresize.core.rundir import read_jsonl

pytestmark = pytest.mark.ray

BUDGET = "train.max_tokens_per_micro_batch=40"
"""Groups of 4 samples of ~20-40 tokens each: cut into 2-4 micro-batches."""


def test_token_budget_streamed_and_balanced_give_the_same_run(device_pool: Any,
                                                              tmp_path: Path) -> None:
    hyst = run(device_pool, tmp_path / "h", BUDGET)
    static = run(device_pool, tmp_path / "s", BUDGET, "controller.policy='static'")
    assert static["num_resizes"] == 0
    assert sample_view(tmp_path / "h") == sample_view(tmp_path / "s")
    assert hyst["param_sha256"] == static["param_sha256"]
    # the streamed run trained every step (its groups cut under the budget)
    assert [m["step"] for m in read_jsonl(tmp_path / "h" / "metrics.jsonl")] == list(range(6))
