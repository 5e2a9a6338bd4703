"""rollout.engine = 'vllm' on the real path (Ray actors, gloo, FSDP2): a forced schedule of
resizes in both directions, some mid-rollout with requests migrated (aborted on one vLLM
engine, resubmitted with their prefix on another), writes the same samples as the static run,
also with speculative decoding on; the twin calibrates from a vLLM run. Skipped without vLLM
(CI installs it)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from run_views import max_param_diff, sample_view  # noqa: E402

from dynaresize.config import load_config  # noqa: E402
from dynaresize.core.rundir import read_jsonl  # noqa: E402

pytestmark = pytest.mark.ray

BASE = ["run.steps=4", "run.staleness=1", "task.prompts_per_step=8", "task.samples_per_prompt=4",
        "task.max_new_tokens=128", "train.micro_batch_size=2", "output.progress='plain'",
        "rollout.max_running_requests=4", "rollout.slice_s=0.02", "resize.staging_bytes=4096",
        "rollout.engine='vllm'", "model.num_heads=2", f"rollout.vllm_kv_cache_bytes={32 * 2**20}"]
SCHEDULE = ("resize.schedule=["
            "{step=0, at='rollout:0.1', move='rollout->train', num_devices=1},"
            "{step=1, at='start', move='train->rollout', num_devices=2},"
            "{step=2, at='rollout:0.1', move='rollout->train', num_devices=1},"
            "{step=3, at='rollout:0.4', move='train->rollout', num_devices=1}]")


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*BASE, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


@pytest.fixture(scope="module")
def static_run(device_pool: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vllm-static")
    run(device_pool, out, "controller.policy='static'")
    return out


def test_forced_schedule_on_vllm_writes_the_static_samples(
        device_pool: Any, static_run: Path, tmp_path: Path) -> None:
    summary = run(device_pool, tmp_path, SCHEDULE)
    assert summary["num_resizes"] == 4
    assert sample_view(tmp_path) == sample_view(static_run)
    assert max_param_diff(tmp_path, static_run) < 1e-2
    static = json.loads((static_run / "summary.json").read_text())
    assert abs(summary["param_sum"] - static["param_sum"]) < 1e-2
    resizes = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["kind"] == "resize"]
    assert resizes and all(e["ok"] for e in resizes)
    # mid-rollout moves resubmitted requests on another vLLM engine (enough work per step that
    # the rollout is still running when a move's optimizer-step boundary comes)
    assert sum(e["migrated"] for e in resizes) > 0
    devices = {s["device"] for s in read_jsonl(tmp_path / "samples.jsonl")}
    assert len(devices) >= 3


def test_speculation_on_vllm_with_migrations_writes_the_static_samples(
        device_pool: Any, static_run: Path, tmp_path: Path) -> None:
    """`rollout.speculative` on vLLM (`rollout.vllm_speculative`) under the same forced
    schedule: the static run's samples (speculation off), with drafts verified on the way."""
    summary = run(device_pool, tmp_path, SCHEDULE, "rollout.speculative.enabled=true",
                  "rollout.speculative.min_ngram=1")
    assert summary["num_resizes"] == 4
    assert summary["speculation"]["verify_iterations"] > 0
    assert sample_view(tmp_path) == sample_view(static_run)
    assert max_param_diff(tmp_path, static_run) < 1e-2


def test_the_twin_calibrates_from_a_vllm_run(static_run: Path) -> None:
    from dynaresize.sim.calibrate import calibrate, cost_model_from_fit

    fit = calibrate(static_run)
    assert fit["quality"]["num_rollout_spans"] >= 4
    assert all(math.isfinite(v) and v >= 0 for v in fit["fitted"].values())
    assert fit["fitted"]["iteration_overhead_s"] + fit["fitted"]["decode_s_per_request_iter"] > 0
    cost_model_from_fit(fit["fitted"])


def episode_view(path: Path) -> dict[tuple[int, int, int], Any]:
    """(step, prompt, sample) → the episode without its devices: version, every turn's token
    count, hash and version, and the observations; each episode once."""
    records = read_jsonl(path / "samples.jsonl")
    view = {(r["step"], r["prompt"], r["sample"]): (
        r["version"], r["tokens_sha256"], r["reward"],
        [(t["tokens"], t["tokens_sha256"], t["version"]) for t in r["turns"]],
        r["observations"]) for r in records}
    assert len(view) == len(records), "an episode was recorded twice"
    return view


def test_episodes_on_vllm_with_resizes_write_the_static_records(
        device_pool: Any, tmp_path: Path) -> None:
    """`[env]` turns on the vLLM engine: a turn is an ordinary request of the step's run, so
    the forced schedule (turns migrated between vLLM engines mid-rollout) writes the static
    run's episodes, and the environment answers each turn once."""
    env = ("env.name='retry'", "env.max_turns=2")
    static = run(device_pool, tmp_path / "static", "controller.policy='static'", *env)
    moved = run(device_pool, tmp_path / "moved", SCHEDULE, *env)
    assert moved["num_resizes"] == 4
    view = episode_view(tmp_path / "static")
    assert episode_view(tmp_path / "moved") == view
    assert any(len(turns) == 2 for _, _, _, turns, _ in view.values())
    assert static["env_max_calls_per_turn"] == moved["env_max_calls_per_turn"] == 1
    assert max_param_diff(tmp_path / "moved", tmp_path / "static") < 1e-2
