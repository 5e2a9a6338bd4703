"""The oracle lower bound: its two terms, staleness, and which binds."""

from __future__ import annotations

import numpy as np
import pytest

from dynaresize.sim.costs import get_cost_model
from dynaresize.sim.oracle import (
    oracle_result,
    oracle_step,
    oracle_steps,
    rollout_device_s,
    tail_s,
    trained_tokens,
)
from dynaresize.sim.workloads import StepRequests, get_workload

COSTS = get_cost_model("h100-7b")


def _req(lengths: list[list[int]], prompts: list[int]) -> StepRequests:
    return StepRequests(0, np.array(lengths, dtype=np.int64), np.array(prompts, dtype=np.int64))


def test_tail_is_longest_request_alone() -> None:
    req = _req([[10, 1000], [20, 30]], [50, 60])
    expected = COSTS.prefill_s(50) + sum(COSTS.decode_iter_s(1, 50 + j) for j in range(1000))
    assert tail_s(COSTS, req) == pytest.approx(expected)


def test_rollout_bound_below_any_batch_one_schedule() -> None:
    req = get_workload("balanced", prompts_per_step=4, samples_per_prompt=4).step_requests(0)
    serial_s = sum(COSTS.prefill_s(int(p)) + COSTS.decode_span_s(int(n), 1, int(p))
                   for p, row in zip(req.prompt_tokens, req.response_tokens) for n in row)
    assert 0 < rollout_device_s(COSTS, req) < serial_s


def test_tail_bound_at_scale_work_bound_when_small() -> None:
    wl = get_workload("dapo-7b", requests_per_step=1024)
    small = oracle_step(COSTS, wl.step_requests(0), 4, staleness=1)
    big = oracle_step(COSTS, wl.step_requests(0), 4096, staleness=1)
    assert small.binds == "work-bound" and big.binds == "tail-bound"
    # staleness 1: two step periods cover the tail, the optimizer step and a weight sync
    expected = (tail_s(COSTS, wl.step_requests(0)) + COSTS.train_step_overhead_s
                + COSTS.weight_sync_s()) / 2
    assert big.step_s == pytest.approx(expected)
    assert small.step_s == pytest.approx((small.rollout_device_s + small.train_device_s) / 4)


def test_on_policy_forces_only_the_update_after_the_tail() -> None:
    """Staleness 0: training streams over completed groups during the tail, so only the
    optimizer step and the weight sync are forced after the longest request; (b) pays the
    weight sync, which nothing overlaps."""
    req = get_workload("balanced", requests_per_step=512).step_requests(0)
    off = oracle_step(COSTS, req, 64, staleness=1)
    on = oracle_step(COSTS, req, 64, staleness=0)
    forced_s = tail_s(COSTS, req) + COSTS.train_step_overhead_s + COSTS.weight_sync_s()
    assert on.tail_s == pytest.approx(forced_s)
    assert off.tail_s == pytest.approx(forced_s / 2)
    assert on.work_s == pytest.approx(off.work_s + COSTS.weight_sync_s())
    assert on.step_s > off.step_s


def test_on_policy_bound_below_streamed_step() -> None:
    """A step whose training all streams during its tail still ends after the tail, the
    optimizer step and the sync: the bound is below that, and below serialised training."""
    req = get_workload("agentic", requests_per_step=256).step_requests(0)
    on = oracle_step(COSTS, req, 32, staleness=0)
    serial_s = tail_s(COSTS, req) + COSTS.train_step_s(trained_tokens(req), 32) \
        + COSTS.weight_sync_s()
    assert on.step_s < serial_s


def test_result_row_shape() -> None:
    steps = oracle_steps(COSTS, get_workload("balanced", requests_per_step=256), 8, 3, 1)
    row = oracle_result(steps)
    assert row["policy"] == "oracle" and row["num_resizes"] == 0
    for key in ("split", "mean_step_s", "p99_step_s", "samples_per_s", "tokens_per_s",
                "bubble_fraction"):
        assert key in row
    assert row["samples_per_s"] == pytest.approx(3 * 256 / sum(s.step_s for s in steps))
    with pytest.raises(ValueError):
        oracle_step(COSTS, steps and get_workload("balanced").step_requests(0), 0, 1)
