"""Cost models: presets from public figures, roofline regimes, closed forms."""

from __future__ import annotations

import numpy as np
import pytest

from dynaresize.sim.costs import H100, H200, PRESETS, QWEN_7B, QWEN_32B, get_cost_model


def test_public_figures() -> None:
    assert H100.hbm_bytes_per_s == 3.35e12 and H200.hbm_bytes_per_s == 4.8e12
    assert H100.bf16_flops_per_s == H200.bf16_flops_per_s == 989e12
    assert (H100.memory_bytes, H200.memory_bytes) == (80e9, 141e9)
    assert QWEN_7B.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2
    assert QWEN_32B.weight_bytes == pytest.approx(65.6e9)


def test_kv_capacity() -> None:
    assert get_cost_model("h200-7b").kv_capacity_tokens() > get_cost_model(
        "h100-7b").kv_capacity_tokens() > 500_000
    assert 10_000 < get_cost_model("h100-32b").kv_capacity_tokens() < 50_000
    with pytest.raises(ValueError, match="does not fit"):
        get_cost_model("h100-32b", kv_memory_fraction=0.5).kv_capacity_tokens()


def test_memory_bound_small_batch_compute_bound_large() -> None:
    c = get_cost_model("h100-7b")
    weights_s = QWEN_7B.weight_bytes / (H100.hbm_bytes_per_s * c.decode_bw_efficiency)
    assert c.decode_iter_s(1, 0) == pytest.approx(c.iteration_overhead_s + weights_s)
    # per-token time falls with batch, then the compute floor
    per_token = [c.decode_iter_s(b, 0) / b for b in (1, 8, 64, 256)]
    assert per_token == sorted(per_token, reverse=True)
    big = 4096
    assert c.decode_iter_s(big, 0) == pytest.approx(
        c.iteration_overhead_s + 2 * QWEN_7B.num_params * big / (989e12 * c.decode_mfu))
    assert c.decode_iter_s(8, 100_000) > c.decode_iter_s(8, 1_000)  # KV reads cost


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize(("n", "b", "c0"), [(1, 1, 0), (500, 1, 100), (50, 256, 1000),
                                             (300, 512, 20_000), (7, 3000, 0)])
def test_span_closed_form_matches_sum(name: str, n: int, b: int, c0: int) -> None:
    c = PRESETS[name]
    brute = sum(c.decode_iter_s(b, c0 + b * j) for j in range(n))
    assert c.decode_span_s(n, b, c0) == pytest.approx(brute, rel=1e-9)
    assert c.decode_span_s(0, b, c0) == 0.0


def test_span_vectorised_and_inverse() -> None:
    c = get_cost_model("h200-7b")
    out = c.decode_span_s(np.array([10, 20]), 1, np.array([5, 5]))
    assert out[1] > out[0] > 0
    n = c.decode_iters_within(2.0, 64, 5000)
    assert c.decode_span_s(n, 64, 5000) <= 2.0 < c.decode_span_s(n + 1, 64, 5000)


def test_training_and_sync() -> None:
    c = get_cost_model("h100-7b")
    assert c.train_token_s() == pytest.approx(8 * 7.62e9 / (989e12 * 0.4))
    assert c.dp_efficiency(1) == 1.0 and c.dp_efficiency(1024) < c.dp_efficiency(2)
    assert c.train_step_s(1_000_000, 8) < c.train_step_s(1_000_000, 4)
    assert c.weight_sync_s() == pytest.approx(0.05 + 15.24e9 / 50e9)
    assert c.train_state_bytes(4) == pytest.approx(7.62e9 * 16 / 4)
    with pytest.raises(ValueError, match="allowed"):
        get_cost_model("a100-7b")
