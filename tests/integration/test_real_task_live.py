"""A pretrained-model run on the real path, small: a local checkpoint with its own tokenizer
(`model.path`), a reasoning-gym task, held-out evaluation and TensorBoard. A forced schedule of
resizes (mid-rollout moves migrate requests) writes the same sample records as the static run,
with whole-prompt prefill on."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from run_views import sample_view  # noqa: E402
from tiny_checkpoint import write_tiny_checkpoint  # noqa: E402

from dynaresize.config import load_config  # noqa: E402
from dynaresize.core.rundir import read_jsonl  # noqa: E402

pytestmark = pytest.mark.ray
pytest.importorskip("reasoning_gym")

BASE = ["run.steps=3", "run.staleness=1", "task.name='reasoning_gym'",
        "task.generator='basic_arithmetic'",
        "task.generator_args={min_terms=2, max_terms=2, min_digits=2, max_digits=2, "
        "operators=['+'], allow_parentheses=false, allow_negation=false}",
        "task.question_template='{expression} ='", "task.prompts_per_step=4",
        "task.samples_per_prompt=4", "task.max_new_tokens=6", "train.micro_batch_size=4",
        "train.lr=1e-3", "rollout.max_running_requests=4", "rollout.slice_s=0.02",
        "rollout.whole_prompt_prefill=true", "eval.every=2", "eval.num_prompts=8",
        "controller.policy='static'", "output.progress='plain'", "resize.staging_bytes=4096"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.25', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=2, at='rollout:0.3', move='rollout->train', num_devices=1}]")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


def run(pool: Any, out: Path, checkpoint: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, f"model.path='{checkpoint}'", *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


def test_resized_run_writes_the_static_runs_samples(device_pool: Any, checkpoint: Path,
                                                    tmp_path: Path) -> None:
    static, resized = tmp_path / "static", tmp_path / "resized"
    run(device_pool, static, checkpoint)
    summary = run(device_pool, resized, checkpoint, SCHEDULE)
    assert summary["num_resizes"] == 3
    assert sample_view(resized) == sample_view(static)
    resizes = [e for e in read_jsonl(resized / "events.jsonl") if e["kind"] == "resize"]
    assert sum(e["migrated"] for e in resizes) > 0  # mid-rollout moves migrated requests
    rewards = {(s["step"], s["prompt"], s["sample"]): s["reward"]
               for s in read_jsonl(static / "samples.jsonl")}
    assert rewards == {(s["step"], s["prompt"], s["sample"]): s["reward"]
                       for s in read_jsonl(resized / "samples.jsonl")}
    metrics = read_jsonl(static / "metrics.jsonl")
    assert [m.get("eval_version") for m in metrics] == [0, None, 3]
    assert all(0.0 <= m["eval_accuracy"] <= m["eval_reward"] + 1e-9 <= 1.0 + 1e-9
               for m in metrics if "eval_accuracy" in m)
    evals = read_jsonl(static / "eval.jsonl")
    assert [e["eval_version"] for e in evals] == [0, 3] and evals[0]["examples"]
    assert "eval_accuracy_last" in summary
    if importlib.util.find_spec("tensorboard") is not None:
        assert list(static.glob("events.out.tfevents.*"))
    report_text = __import__("dynaresize.app.report", fromlist=["report"]).report(static)
    assert "held-out accuracy" in report_text and (static / "eval.png").is_file()
