"""GRPO advantages and the PPO-clip / k3-KL token sums (pure tensor code)."""

from __future__ import annotations

import math

import pytest
import torch

from dynaresize.train.grpo import (
    clipped_token_count,
    group_advantages,
    kl_penalty_sum,
    ppo_clip_loss_sum,
    token_logprobs,
)


def test_group_advantages_normalise_within_each_group() -> None:
    adv = group_advantages([1.0, 0.0, 0.0, 1.0, 0.3, 0.3, 0.3, 0.3], group_size=4)
    std = math.sqrt(4 * 0.25 / 3)
    assert adv[:4] == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std], rel=1e-5)
    assert adv[4:] == [0.0, 0.0, 0.0, 0.0]  # all equal: exactly zero, no rounding residue


def test_group_advantages_tensor_matches_list() -> None:
    rewards = torch.tensor([[1.0, 2.0, 4.0], [0.1, 0.1, 0.1]])
    from_tensor = group_advantages(rewards)
    from_list = group_advantages(rewards.flatten().tolist(), group_size=3)
    assert isinstance(from_tensor, torch.Tensor) and from_tensor.shape == (2, 3)
    assert from_tensor.flatten().tolist() == pytest.approx(from_list, rel=1e-6)
    assert from_tensor[1].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("rewards,group_size", [([1.0, 2.0, 3.0], 2), ([1.0, 2.0], 1),
                                                ([1.0, 2.0], None)])
def test_group_advantages_rejects_bad_groups(rewards: list[float], group_size: int | None) -> None:
    with pytest.raises(ValueError):
        group_advantages(rewards, group_size)
    with pytest.raises(ValueError):
        group_advantages(torch.ones(4))


def test_token_logprobs() -> None:
    logits = torch.randn(2, 3, 5, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[0, 4, 2], [1, 1, 3]])
    expected = torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    assert torch.allclose(token_logprobs(logits, targets), expected)
    with pytest.raises(ValueError):
        token_logprobs(logits, targets[:, :2])


def _leaf(values: list[float]) -> torch.Tensor:
    return torch.tensor([values], requires_grad=True)


def test_ppo_loss_at_ratio_one_is_minus_advantage_sum() -> None:
    logp = _leaf([-1.0, -2.0, -0.5])
    adv = torch.tensor([[2.0, -1.0, 5.0]])
    mask = torch.tensor([[True, True, False]])
    loss = ppo_clip_loss_sum(logp, logp.detach(), adv, mask, clip_eps=0.2)
    assert float(loss.detach()) == pytest.approx(-(2.0 - 1.0))
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-2.0, 1.0, 0.0])


def test_ppo_clipping_stops_gradient_only_on_the_trusted_side() -> None:
    old = torch.zeros(1, 4)
    # ratios e^0.5 > 1.2 and e^-0.5 < 0.8; advantages +, -, +, -.
    logp = _leaf([0.5, -0.5, -0.5, 0.5])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss = ppo_clip_loss_sum(logp, old, adv, mask, clip_eps=0.2)
    loss.backward()
    grad = logp.grad[0].tolist()
    assert grad[0] == 0.0 and grad[1] == 0.0  # clipped: no incentive to move further
    assert grad[2] == pytest.approx(-math.exp(-0.5)) and grad[3] == pytest.approx(math.exp(0.5))
    assert int(clipped_token_count(logp, old, mask, 0.2)) == 4
    assert int(clipped_token_count(logp, old, mask, 0.7)) == 0


def test_ppo_loss_sums_over_micro_batches() -> None:
    g = torch.Generator().manual_seed(1)
    logp, old, adv = (torch.randn(4, 6, generator=g) for _ in range(3))
    mask = torch.rand(4, 6, generator=g) > 0.3
    whole = ppo_clip_loss_sum(logp, old, adv, mask, 0.2)
    parts = sum(ppo_clip_loss_sum(logp[i:i + 2], old[i:i + 2], adv[i:i + 2], mask[i:i + 2], 0.2)
                for i in (0, 2))
    assert float(whole) == pytest.approx(float(parts), rel=1e-6)


def test_kl_penalty_k3() -> None:
    logp = torch.tensor([[-1.0, -2.0, -3.0]])
    mask = torch.tensor([[True, True, False]])
    assert float(kl_penalty_sum(logp, logp, mask)) == 0.0
    ref = torch.tensor([[-1.5, -1.0, -9.0]])
    expected = sum(math.exp(d) - d - 1 for d in (-0.5, 1.0))
    assert float(kl_penalty_sum(logp, ref, mask)) == pytest.approx(expected, rel=1e-6)
