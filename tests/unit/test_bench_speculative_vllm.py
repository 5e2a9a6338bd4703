"""bench/speculative_vllm.py's summary, blocks and acceptance file, and bench/spec_warm.py's
warm-up prompts (pure, milliseconds)."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from spec_warm import (  # noqa: E402
    WARM_REQUEST_STEP,
    request_specs,
    warm_prompts,
    warm_step,
)
from speculative_vllm import _summarise, acceptance_file, format_block, markers  # noqa: E402

from dynaresize.core.types import request_seed  # noqa: E402
from dynaresize.tasks.base import global_index  # noqa: E402


def _args(warm_prompts: int, concurrent: int = 1) -> Namespace:
    return Namespace(temperature=1.0, max_draft_tokens=7, full_batch=0, max_new_tokens=64,
                     concurrent=concurrent, rounds=2, warm_prompts=warm_prompts)


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
    assert markers(1.0, num_warm=32)[0] == "<!-- bench-speculative-vllm-t1-w32:start -->"


def test_only_fresh_engines_one_request_at_a_time_write_the_twins_file() -> None:
    assert acceptance_file(_args(0)).name == "spec_acceptance_vllm_t1.json"
    assert acceptance_file(_args(32)) is None
    assert acceptance_file(_args(0, concurrent=4)) is None


class _Task:
    """Numbers its prompts as the tasks do (`global_index`)."""

    def batch(self, step: int, num_prompts: int, seed: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(id=global_index(step, num_prompts, i), tokens=[1, 2, i])
                for i in range(num_prompts)]


def test_warm_up_prompts_never_meet_the_timed_ones() -> None:
    for num_timed in range(0, 40):
        for num_warm in range(1, 40):
            got = warm_prompts(_Task(), num_timed, num_warm, seed=0)
            ids = [p.id for p in got]
            assert len(ids) == num_warm and min(ids) >= num_timed, (num_timed, num_warm)
    assert warm_step(3, 32) == 1 and warm_step(3, 2) == 2 and warm_prompts(_Task(), 3, 0, 0) == []
    specs = request_specs(WARM_REQUEST_STEP, warm_prompts(_Task(), 3, 2, 0), range(4), 16, 1.0,
                          run_seed=7)
    assert len(specs) == 8 and {s.step for s in specs} == {WARM_REQUEST_STEP}
    assert len({s.seed for s in specs}) == 8
    assert all(s.seed == request_seed(7, s.step, s.prompt, s.sample) for s in specs)
