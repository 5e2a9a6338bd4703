"""The world's rendezvous store is served by device 0 (rank 0). When device 0 dies, the store
dies with it: the survivors' new world must rendezvous on a store served by a survivor, and
the shared pool, repaired after the run, on one served by the replacement actor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from run_views import sample_view

from dynaresize.config import load_config

pytestmark = pytest.mark.ray

BASE = ["run.steps=3", "run.staleness=1", "task.prompts_per_step=4", "task.samples_per_prompt=4",
        "task.max_new_tokens=12", "train.micro_batch_size=2", "controller.policy='static'",
        "output.progress='plain'", "rollout.slice_s=0.05", "rollout.max_running_requests=4",
        "output.save_model=false"]


def run(device_pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *overrides], check_machine=False)
    return run_training(cfg, out, pool=device_pool(cfg.num_devices))


def test_losing_the_store_host_loses_nothing(device_pool: Any, tmp_path: Path) -> None:
    run(device_pool, tmp_path / "reference")
    pool = device_pool(4)
    old_pid = pool.pids[0]
    summary = run(device_pool, tmp_path / "faulty",
                  "faults.kill=[{device=0, step=1, at='rollout:0.3'}]")
    assert [f["device"] for f in summary["faults"]] == [0]
    assert sample_view(tmp_path / "faulty") == sample_view(tmp_path / "reference")
    reference = json.loads((tmp_path / "reference" / "summary.json").read_text())
    assert summary["param_sha256"] == reference["param_sha256"]
    assert pool.pids[0] != old_pid and all(pool.is_alive(i) for i in range(4))  # repaired
    assert summary["nodes"] == 1 and len(set(summary["device_nodes"])) == 1
