"""The CUDA path (skipped without CUDA): devices with one GPU each (`num_gpus=1`, NCCL for
CUDA tensors), or two devices sharing the one GPU of a single-GPU machine. A static run trains
and records every sample; with >= 3 GPUs a forced resize schedule writes the same samples and
the same final weights as the static run (`scripts/gpu-check.sh` runs the same on a GPU
machine, with both engines and the benchmarks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_views import sample_view

from dynaresize.config import load_config
from dynaresize.core.rundir import read_jsonl

pytestmark = [pytest.mark.gpu, pytest.mark.ray]

SCHEDULE = ("resize.schedule=[{step=1, at='start', move='rollout->train', num_devices=1},"
            "{step=2, at='rollout:0.3', move='train->rollout', num_devices=1}]")


def base() -> list[str]:
    import torch

    num_gpus = torch.cuda.device_count()
    num_devices = min(num_gpus, 4) if num_gpus >= 2 else 2
    share = 1.0 if num_gpus >= 2 else 0.5
    return ["devices.type='cuda'", f"devices.gpus_per_device={share}",
            f"allocation.num_rollout_devices={num_devices - num_devices // 2}",
            f"allocation.num_train_devices={num_devices // 2}", "run.steps=3",
            "task.prompts_per_step=4", "task.samples_per_prompt=4", "train.micro_batch_size=2",
            "controller.policy='static'", "output.progress='plain'", "output.save_model=false"]


def train(out: Path, *overrides: str) -> dict:
    from dynaresize.app.runner import run_training

    return run_training(load_config(None, [*base(), *overrides]), out)


def test_cuda_devices_train(ray_cluster: None, tmp_path: Path) -> None:
    summary = train(tmp_path)
    assert summary["steps"] == 3 and summary["nodes"] == 1
    assert len(read_jsonl(tmp_path / "samples.jsonl")) == 3 * 4 * 4
    assert json.loads((tmp_path / "summary.json").read_text())["param_sha256"]


def test_forced_schedule_on_cuda_writes_the_static_samples(ray_cluster: None,
                                                           tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() < 3:
        pytest.skip("needs >= 3 GPUs (NCCL: one rank per GPU in a group)")
    static = train(tmp_path / "static")
    forced = train(tmp_path / "forced", SCHEDULE)
    assert forced["num_resizes"] == 2
    assert sample_view(tmp_path / "forced") == sample_view(tmp_path / "static")
    assert forced["param_sha256"] == static["param_sha256"]
