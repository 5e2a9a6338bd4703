"""bench/speculative_vllm.py's summary, blocks and warm-up prompts (pure, milliseconds)."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from speculative_vllm import _summarise, format_block, markers  # noqa: E402


def _args(warm_prompts: int) -> Namespace:
    return Namespace(temperature=1.0, max_draft_tokens=7, full_batch=0, max_new_tokens=64,
                     concurrent=1, rounds=2, warm_prompts=warm_prompts)


def _rows() -> list[dict]:
    # 4 requests; the longest (40 tokens) is the tail; speculation halves its forwards
    return [{"tokens": n, "on_tokens": n, "same": True, "agreeing_tokens": n,
             "max_logprob_diff": 0.0, "off_s": n / 10, "on_s": n / 20, "off_steps": n,
             "on_steps": n // 2} for n in (10, 20, 30, 40)]


def _stats() -> SimpleNamespace:
    return SimpleNamespace(num_verify_iterations=50, num_draft_tokens=200,
                           num_accepted_tokens=50, accepted_histogram={0: 25, 2: 25})


def test_the_summary_and_the_blocks_name_the_warm_up() -> None:
    fresh = _summarise(_rows(), _stats(), _args(0))
    assert fresh["tail_tokens_per_s"] == {"off": 10.0, "on": 20.0}
    assert fresh["tail_tokens_per_forward"] == {"off": 1.0, "on": 2.0}
    assert fresh["token_agreement"] == 1.0 and fresh["warm_prompts"] == 0
    text = format_block(fresh)
    assert "**2.00x** on the tail" in text and "--warm-prompts" not in text
    warm = format_block(_summarise(_rows(), _stats(), _args(32)))
    assert "--warm-prompts 32" in warm and "samples of 32 other prompts" in warm
    assert markers(1.0) == ("<!-- bench-speculative-vllm-t1:start -->",
                            "<!-- bench-speculative-vllm-t1:end -->")
    assert markers(1.0, warm_prompts=32)[0] == "<!-- bench-speculative-vllm-t1-w32:start -->"
