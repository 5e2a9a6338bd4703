"""`[train.loss]` options (docs/recipes.md), each against a value computed by hand on a tiny
batch: clip ranges, GSPO's sequence ratio, the aggregations' weights and normalisers, the KL
estimators, the entropy term, Dr. GRPO's advantages and DAPO's overlong shaping."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from dynaresize.config import LossConfig, TrainConfig
from dynaresize.core.advantages import (
    AdvantageSpec,
    advantage_spec,
    group_advantages,
    overlong_penalty,
    spec_advantages,
)
from dynaresize.core.types import TrainSample
from dynaresize.train.forward import (
    LossSpec,
    loss_denominator,
    loss_spec,
    micro_batch_loss,
    padding_micro_batch,
    row_weights,
)
from dynaresize.train.grpo import (
    clipped_token_count,
    importance_ratio,
    kl_penalty_sum,
    ppo_clip_loss_sum,
    token_entropy,
)

MASK = torch.tensor([[True, True, False], [True, False, False]])


def test_clip_higher_decouples_the_two_ranges() -> None:
    # ratio 1.25 with A = +1 (row 0), ratio 0.7 with A = -1 (row 1)
    logp = torch.tensor([[math.log(1.25), 0.0, 0.0], [math.log(0.7), 0.0, 0.0]])
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3])
    mask = torch.tensor([[True, False, False], [True, False, False]])
    # symmetric 0.2: -min(1.25, 1.2) = -1.2 and max(0.7, 0.8) = 0.8
    assert float(ppo_clip_loss_sum(logp, old, adv, mask, 0.2)) == pytest.approx(-1.2 + 0.8)
    # clip-higher 0.28: 1.25 is inside, -1.25; the low side is unchanged
    assert float(ppo_clip_loss_sum(logp, old, adv, mask, 0.2, clip_high=0.28)) == \
        pytest.approx(-1.25 + 0.8)
    assert int(clipped_token_count(logp, old, mask, 0.2)) == 2
    assert int(clipped_token_count(logp, old, mask, 0.2, clip_high=0.28)) == 1


def test_gspo_ratio_is_the_sequence_mean_log_ratio() -> None:
    logp = torch.tensor([[0.1, 0.3, 9.0], [0.5, 9.0, 9.0]])
    ratio = importance_ratio(logp, torch.zeros(2, 3), MASK, sequence=True)
    assert ratio[0, :2].tolist() == pytest.approx([math.exp(0.2)] * 2)
    assert float(ratio[1, 0]) == pytest.approx(math.exp(0.5))
    adv = torch.ones(2, 3)
    # clip 0.3: e^0.2 = 1.221 inside (2 tokens); e^0.5 = 1.649 clipped to 1.3
    got = ppo_clip_loss_sum(logp, torch.zeros(2, 3), adv, MASK, 0.3, sequence_ratio=True)
    assert float(got) == pytest.approx(-2 * math.exp(0.2) - 1.3)


def test_kl_estimators() -> None:
    logp, ref = torch.full((2, 3), -1.0), torch.full((2, 3), -0.5)  # d = ref - logp = 0.5
    expected = {"k1": -0.5, "k2": 0.125, "k3": math.exp(0.5) - 1.5}
    for name, per_token in expected.items():
        assert float(kl_penalty_sum(logp, ref, MASK, name)) == pytest.approx(3 * per_token)
    weights = torch.tensor([[0.5], [1.0]])
    assert float(kl_penalty_sum(logp, ref, MASK, "k2", weights)) == pytest.approx(2 * 0.125)
    with pytest.raises(ValueError, match="k4"):
        kl_penalty_sum(logp, ref, MASK, "k4")


def test_entropy_of_uniform_and_peaked_logits() -> None:
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -1e9, -1e9]]])
    h = token_entropy(logits)[0].tolist()
    # uniform over 4: ln 4; probabilities (1/4, 3/4): -(1/4 ln 1/4 + 3/4 ln 3/4)
    assert h[0] == pytest.approx(math.log(4))
    assert h[1] == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def _sample(prompt: int, sample: int, response: int, group_tokens: int) -> TrainSample:
    return TrainSample(0, prompt, sample, [1], [2] * response, [0.0] * response, 1.0, 1.0,
                       group_tokens)


def test_aggregation_weights_and_normalisers() -> None:
    mb = [_sample(0, 0, 2, 6), _sample(0, 1, 4, 6), _sample(1, 0, 3, 3)]
    assert row_weights(mb, "token") is None and row_weights(mb, "constant") is None
    assert row_weights(mb, "sequence").flatten().tolist() == pytest.approx([1 / 2, 1 / 4, 1 / 3])
    assert row_weights(mb, "group").flatten().tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 3])
    with pytest.raises(ValueError, match="group_tokens"):
        row_weights([_sample(0, 0, 2, 0)], "group")
    stats = torch.tensor([0.0, 0.0, 9.0, 0.0, 3.0, 2.0, 0.0], dtype=torch.float64)
    expected = {"token": 9, "sequence": 3, "group": 2, "constant": 3 * 40}
    for name, value in expected.items():
        assert loss_denominator(stats, LossSpec(0.2, 0.0, aggregation=name,
                                                max_new_tokens=40)) == value


class FixedLogits(torch.nn.Module):
    """A 'model' whose logits are a parameter (vocab 4), whatever the input."""

    def __init__(self, length: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.logits = torch.nn.Parameter(torch.randn(1, length, 4, generator=g))

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
        return SimpleNamespace(logits=self.logits.expand(input_ids.shape[0], -1, -1))


def test_sequence_aggregation_is_the_mean_of_sequence_means() -> None:
    """End to end through micro_batch_loss: 'sequence' = mean over sequences of their token
    means; 'token' = token sum / tokens; 'constant' = sum / (sequences x cap)."""
    samples = [TrainSample(0, 0, 0, [1], [2, 3], [-1.0, -1.2], 0.5, 1.0, 5),
               TrainSample(0, 0, 1, [1], [1, 0, 2], [-1.1, -0.9, -1.3], -0.5, 0.0, 5)]
    model = FixedLogits(4)
    logp = torch.log_softmax(model.logits[0].detach(), dim=-1)
    per_token = []  # -A * ratio (no clipping at this eps) per response token, per sample
    for s in samples:
        targets = s.response_tokens
        rows = [float(logp[t, tok]) for t, tok in enumerate(targets)]
        per_token.append([-s.advantage * math.exp(lp - old)
                          for lp, old in zip(rows, s.behavior_logprobs)])
    tokens = sum(len(p) for p in per_token)
    expected = {"token": sum(map(sum, per_token)) / tokens,
                "sequence": sum(sum(p) / len(p) for p in per_token) / 2,
                "group": sum(map(sum, per_token)) / 5,
                "constant": sum(map(sum, per_token)) / (2 * 10)}
    for name, value in expected.items():
        spec = LossSpec(100.0, 0.0, aggregation=name, max_new_tokens=10)
        loss_sum, stats = micro_batch_loss(model, None, samples, spec, torch.device("cpu"))
        got = float(loss_sum.detach()) / loss_denominator(stats, spec)
        assert got == pytest.approx(value, rel=1e-5)


@pytest.mark.parametrize("aggregation", ["token", "sequence", "group", "constant"])
def test_a_padding_round_runs_under_every_aggregation(aggregation: str) -> None:
    """A rank with fewer micro-batches than its peers runs `padding_micro_batch` (weight 0)
    so the collectives line up: it must run whatever the aggregation ('group' raised, so a
    step trained on one trainer and failed on two)."""
    spec = LossSpec(0.2, 0.0, aggregation=aggregation, max_new_tokens=4)
    loss_sum, _ = micro_batch_loss(FixedLogits(2), None, padding_micro_batch(), spec,
                                   torch.device("cpu"))
    assert float(loss_sum.detach()) == 0.0  # advantage 0: it adds nothing, whatever weighs it


def test_entropy_bonus_lowers_the_loss_by_coef_times_entropy() -> None:
    samples = [TrainSample(0, 0, 0, [1], [2, 3], [-1.0, -1.2], 0.0, 1.0, 2)]
    model = FixedLogits(3)
    h = token_entropy(model.logits.detach())[0, :2].sum()
    spec = LossSpec(0.2, 0.0, entropy_coef=0.1)
    loss_sum, stats = micro_batch_loss(model, None, samples, spec, torch.device("cpu"))
    assert float(loss_sum.detach()) == pytest.approx(-0.1 * float(h), rel=1e-6)  # A = 0: no pg term
    assert float(stats[6]) == pytest.approx(float(h), rel=1e-6)


def test_dr_grpo_advantages_have_no_std() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0]
    assert group_advantages(rewards, 4, scale_std=False) == [0.5, -0.5, -0.5, 0.5]
    std = math.sqrt(1 / 3)  # unbiased std of (1, 0, 0, 1)
    assert group_advantages(rewards, 4) == pytest.approx([0.5 / (std + 1e-6)] * 1 + [
        -0.5 / (std + 1e-6)] * 2 + [0.5 / (std + 1e-6)])
    assert group_advantages([1.0] * 4, 4, scale_std=False) == [0.0] * 4


def test_overlong_penalty_window() -> None:
    # cap 40, window 10: free up to 30 tokens, then linear to -penalty at 40
    assert [overlong_penalty(n, 40, 10) for n in (10, 30, 35, 40, 41)] == \
        pytest.approx([0.0, 0.0, -0.5, -1.0, -1.0])
    assert overlong_penalty(35, 40, 10, penalty=0.4) == pytest.approx(-0.2)
    assert overlong_penalty(40, 40, 0) == 0.0
    # equal task rewards, different lengths: the shaped rewards differ, so do advantages
    spec = AdvantageSpec(scale_std=False, overlong_window=10, max_new_tokens=40)
    assert spec_advantages([1.0, 1.0], [30, 40], spec) == pytest.approx([0.5, -0.5])
    assert spec_advantages([1.0, 0.0], [30, 40], None) == group_advantages([1.0, 0.0], 2)


def test_config_maps_to_specs() -> None:
    cfg = TrainConfig()
    spec = loss_spec(cfg, 1.0, 0, 40)
    assert spec == LossSpec(0.2, 0.0, 1.0, 0, None, "token", "token", "k3", 0.0, 40)
    assert advantage_spec(cfg.loss, 40) is None  # GRPO: the original path
    dapo = TrainConfig(loss=LossConfig(clip_low=0.2, clip_high=0.28, overlong_window=8,
                                       advantage="dr-grpo"))
    assert loss_spec(dapo, 1.0, 0, 40).clip_high == 0.28
    assert advantage_spec(dapo.loss, 40) == AdvantageSpec(False, 8, 1.0, 40)
