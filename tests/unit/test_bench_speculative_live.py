"""bench/speculative_live.py's comparison and blocks (pure, milliseconds)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from speculative_live import START, compare, format_block, markers  # noqa: E402


def _run(rollout_s: float, sha: str, tokens: int = 100, tail: float | None = None) -> dict:
    metrics = [{"rollout_s": rollout_s / 2, "step_s": 10.0, "tokens": tokens}] * 2
    if tail is not None:  # two steps' tail tokens/s: tail and 3 x tail
        metrics = [{**metrics[0], "tail_tokens_per_s": tail},
                   {**metrics[1], "tail_tokens_per_s": 3 * tail}]
    records = {(0, 0, s): {"response_tokens": 10 * (s + 1), "reward": 1.0} for s in range(4)}
    summary = {"param_sha256": sha, "speculation": {
        "tokens_per_forward": 1.5, "mean_accepted_per_verify": 0.9, "accepted_tokens": 9,
        "draft_tokens": 20}}
    return {"metrics": metrics, "records": records, "summary": summary}


def test_compare_and_the_blocks_name_the_budget() -> None:
    result = compare(_run(20.0, "a"), _run(10.0, "a"))
    assert result["same_records"] and result["same_weights"]
    assert result["rollout_s"] == {"off": 20.0, "on": 10.0}
    assert not compare(_run(20.0, "a"), _run(10.0, "b"))["same_weights"]
    example = format_block(result)
    assert "rollout **2.00x** faster" in example and "--full-batch" not in example
    any_load = format_block(result, 0)
    assert "--full-batch 0" in any_load and "full_batch = 0" in any_load
    assert markers(None)[0] == START
    assert markers(0) == ("<!-- bench-speculative-live-fb0:start -->",
                          "<!-- bench-speculative-live-fb0:end -->")


def test_a_temperature_names_its_block_and_its_line() -> None:
    result = compare(_run(20.0, "a"), _run(10.0, "a"))
    assert "temperature 0.6," in format_block(result)  # the example's own
    hot = format_block(result, None, 1.0)
    assert "--temperature 1`" in hot and "temperature 1," in hot
    assert markers(None, 1.0)[0] == "<!-- bench-speculative-live-t1:start -->"
    assert markers(0, 1.0)[0] == "<!-- bench-speculative-live-fb0-t1:start -->"


def test_the_tail_is_the_mean_of_the_steps_and_missing_without_the_metric() -> None:
    result = compare(_run(20.0, "a", tail=5.0), _run(10.0, "a", tail=8.0))
    assert result["tail_tokens_per_s"] == {"off": 10.0, "on": 16.0}
    assert "the tail's tokens/s **1.60x**" in format_block(result)
    old = compare(_run(20.0, "a"), _run(10.0, "a", tail=8.0))  # a run without the metric
    assert old["tail_tokens_per_s"]["off"] is None
    assert "the tail's tokens/s **-**" in format_block(old)
