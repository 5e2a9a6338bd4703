"""The real path end to end: Ray actors, gloo, FSDP2, the built-in task, on CPU.

Shares the session's Ray cluster and 4-device pool. Checks the RL-semantics contract of
design §2 on samples.jsonl (§2.1 every sample exactly once in its step, §2.2 fixed versions,
§2.5 the record), reproducibility of the parameter checksum, and invariance to the split.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynaresize.config import load_config
from dynaresize.core.rundir import EVENT_KEYS, METRIC_KEYS, SAMPLE_KEYS, SUMMARY_KEYS, read_jsonl
from dynaresize.core.types import tokens_sha256

pytestmark = pytest.mark.ray

SMALL = ["run.steps=3", "task.prompts_per_step=4", "task.samples_per_prompt=4",
         "task.max_new_tokens=12", "train.micro_batch_size=4", "output.record_tokens=true",
         "output.progress='plain'"]


def run(pool: Any, out: Path, *overrides: str) -> dict[str, Any]:
    from dynaresize.app.runner import run_training

    cfg = load_config(None, [*SMALL, *overrides])
    return run_training(cfg, out, pool=pool(cfg.num_devices))


def by_key(samples: list[dict[str, Any]]) -> dict[tuple[int, int, int], dict[str, Any]]:
    return {(s["step"], s["prompt"], s["sample"]): s for s in samples}


@pytest.mark.parametrize("staleness", [0, 1])
def test_samples_follow_the_contract(device_pool: Any, tmp_path: Path, staleness: int) -> None:
    from dynaresize.tasks import make_task

    summary = run(device_pool, tmp_path, f"run.staleness={staleness}")
    cfg = load_config(None, SMALL)
    task = make_task(cfg)
    samples = read_jsonl(tmp_path / "samples.jsonl")
    assert len(samples) == len(by_key(samples)) == 3 * 16          # none duplicated
    for s in samples:
        assert set(SAMPLE_KEYS) <= set(s)
        assert s["version"] == max(0, s["step"] - staleness)       # §2.2, fixed
        assert s["tokens_sha256"] == tokens_sha256(s["tokens"])
        assert s["response_tokens"] == len(s["tokens"]) <= 12
        assert s["device"] in range(4)           # rollout devices (hysteresis moves them)
    for step in range(3):                                          # §2.1: exactly B_k × n
        prompts = [p.id for p in task.batch(step, 4, cfg.run.seed)]
        got = sorted((s["prompt"], s["sample"]) for s in samples if s["step"] == step)
        assert got == sorted((p, j) for p in prompts for j in range(4))
    metrics = read_jsonl(tmp_path / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    assert all(set(METRIC_KEYS) <= set(m) for m in metrics)
    assert [m["policy_version"] for m in metrics] == [max(0, k - staleness) for k in range(3)]
    events = read_jsonl(tmp_path / "events.jsonl")
    assert {"rollout", "train", "weight_sync"} <= {e["kind"] for e in events}
    assert all(set(EVENT_KEYS) <= set(e) and e["t_end"] >= e["t_start"] for e in events)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= set(on_disk) and on_disk == summary
    assert summary["steps"] == 3 and 0.0 <= summary["bubble_fraction"] < 1.0


def test_same_seed_same_checksum_and_split_invariance(device_pool: Any, tmp_path: Path) -> None:
    a = run(device_pool, tmp_path / "a")
    b = run(device_pool, tmp_path / "b")
    assert a["param_sha256"] == b["param_sha256"] and a["param_sum"] == b["param_sum"]
    c = run(device_pool, tmp_path / "c", "allocation.num_rollout_devices=1",
            "allocation.num_train_devices=3")
    sa = by_key(read_jsonl(tmp_path / "a" / "samples.jsonl"))
    sc = by_key(read_jsonl(tmp_path / "c" / "samples.jsonl"))
    assert sa.keys() == sc.keys()
    for key, rec in sa.items():                 # same tokens whichever engine ran them
        assert (rec["version"], rec["tokens_sha256"]) == (sc[key]["version"],
                                                          sc[key]["tokens_sha256"])
    assert abs(a["param_sum"] - c["param_sum"]) < 1e-3
