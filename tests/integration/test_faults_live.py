"""Device deaths on the real path (Ray actors killed with SIGKILL, gloo, FSDP2): a rollout
device mid-rollout, a training device mid-step, a device mid-resize. Each run finishes, every
expected sample is in samples.jsonl exactly once with its intended version and the same tokens
as a run without faults, and the final parameters match that run within 1e-4."""

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
        "output.progress='plain'", "rollout.slice_s=0.05", "rollout.max_running_requests=4"]


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *overrides], check_machine=False)
    return run_training(cfg, out, pool=pool(cfg.num_devices))






@pytest.fixture(scope="module")
def reference(device_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    run(device_pool, out)
    return out


def check_against(reference: Path, out: Path) -> dict[str, Any]:
    assert sample_view(out) == sample_view(reference)   # nothing lost, duplicated or changed
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [0, 1, 2]
    assert max_param_diff(out, reference) < 1e-4
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_faults"] == 1 and len(summary["kills"]) == 1
    return summary


def test_rollout_device_dies_mid_rollout(device_pool: Any, reference: Path,
                                         tmp_path: Path) -> None:
    run(device_pool, tmp_path, "faults.kill=[{device=1, step=1, at='rollout:0.3'}]")
    summary = check_against(reference, tmp_path)
    fault = summary["faults"][0]
    assert fault["device"] == 1 and fault["role"] == "rollout" and not fault["restored"]
    later = [s for s in read_jsonl(tmp_path / "samples.jsonl") if s["step"] == 2]
    assert {s["device"] for s in later} == {0}           # the dead device left the pool


def test_train_device_dies_mid_step(device_pool: Any, reference: Path, tmp_path: Path) -> None:
    run(device_pool, tmp_path, "faults.kill=[{device=3, step=1, at='train'}]")
    summary = check_against(reference, tmp_path)
    fault = summary["faults"][0]
    assert fault["device"] == 3 and fault["role"] == "train" and fault["restored"]
    assert fault["replayed_steps"] == 1                  # no checkpoint: replay step 0
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["num_train_devices"] for m in metrics] == [2, 1, 1]


def test_device_dies_mid_resize(device_pool: Any, reference: Path, tmp_path: Path) -> None:
    run(device_pool, tmp_path,
        "resize.schedule=[{step=1, at='start', move='rollout->train', num_devices=1}]",
        "faults.kill=[{device=1, step=1, at='resize'}]")
    summary = check_against(reference, tmp_path)
    assert summary["num_resizes"] == 0 and summary["num_failed_resizes"] == 1
    assert summary["faults"][0]["device"] == 1
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [(m["num_rollout_devices"], m["num_train_devices"]) for m in metrics][-1] == (1, 2)


HANG = ["faults.hang_timeout_s=3.0"]


def check_hung(summary: dict[str, Any], device: int) -> dict[str, Any]:
    fault = summary["faults"][0]
    assert fault["device"] == device and fault["cause"].startswith("hung: answered no ping")
    assert summary["kills"][0]["how"] == "hang"
    return fault


def test_rollout_device_freezes_mid_rollout(device_pool: Any, reference: Path,
                                            tmp_path: Path) -> None:
    """A SIGSTOPped rollout device neither answers nor dies: the watchdog kills it after
    `faults.hang_timeout_s`, then it is a death like the one above."""
    run(device_pool, tmp_path, *HANG,
        "faults.kill=[{device=1, step=1, at='rollout:0.3', how='hang'}]")
    fault = check_hung(check_against(reference, tmp_path), 1)
    assert fault["role"] == "rollout" and not fault["restored"]


def test_train_device_freezes_mid_step(device_pool: Any, reference: Path,
                                       tmp_path: Path) -> None:
    """A frozen trainer holds its peers in a collective (its sockets stay open) until the
    watchdog kills it, well before `faults.timeout_s`; the step reruns on the survivors."""
    run(device_pool, tmp_path, *HANG, "faults.kill=[{device=3, step=1, at='train', how='hang'}]")
    fault = check_hung(check_against(reference, tmp_path), 3)
    assert fault["role"] == "train" and fault["restored"]
