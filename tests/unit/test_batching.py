"""Micro-batch planning and packing (pure)."""

from __future__ import annotations

import pytest
import torch

from dynaresize.core.types import TrainSample
from dynaresize.train.batching import (
    deal,
    global_num_tokens,
    make_micro_batches,
    pack,
    plan_step,
)


def sample(prompt: int, index: int, num_prompt: int = 2, num_response: int = 3,
           step: int = 0) -> TrainSample:
    base = 100 * prompt + 10 * index
    return TrainSample(step, prompt, index, [base + i for i in range(num_prompt)],
                       [base + 5 + i for i in range(num_response)],
                       [-0.1 * (i + 1) for i in range(num_response)], float(index), 0.0)


def step_samples() -> list[TrainSample]:
    return [sample(p, s, num_response=1 + (p + s) % 4) for p in (2, 0, 1) for s in (1, 0)]


def test_micro_batches_are_sorted_chunks() -> None:
    mbs = make_micro_batches(step_samples(), 2)
    assert [[(s.prompt, s.sample) for s in mb] for mb in mbs] == [
        [(0, 0), (0, 1)], [(1, 0), (1, 1)], [(2, 0), (2, 1)]]
    assert make_micro_batches(step_samples()[::-1], 2) == mbs


@pytest.mark.parametrize("samples,size", [
    (step_samples(), 4),  # 6 samples do not split into 4s
    (step_samples(), 0),
    ([], 2),
    ([sample(0, 0), sample(0, 0)], 1),  # duplicate
    ([sample(0, 0), sample(0, 1, step=1)], 1),  # two steps
])
def test_micro_batches_reject_bad_input(samples: list[TrainSample], size: int) -> None:
    with pytest.raises(ValueError):
        make_micro_batches(samples, size)


def test_deal_round_robin_with_padding() -> None:
    assert deal(8, 3) == [[0, 3, 6], [1, 4, 7], [2, 5, None]]
    assert deal(4, 2) == [[0, 2], [1, 3]]
    assert deal(2, 4) == [[0], [1], [None], [None]]
    assert deal(0, 2) == [[], []]
    for num, ranks in ((7, 1), (7, 3), (9, 4)):
        plan = deal(num, ranks)
        assert len({len(p) for p in plan}) == 1  # same number of rounds on every rank
        assert sorted(i for p in plan for i in p if i is not None) == list(range(num))
    with pytest.raises(ValueError):
        deal(3, 0)


def test_plan_composition_does_not_depend_on_ranks() -> None:
    def composition(num_ranks: int) -> list[list[tuple[int, int]]]:
        plan = plan_step(step_samples(), 2, num_ranks)
        rounds = max(len(p) for p in plan)
        ordered = [plan[r][k] for k in range(rounds) for r in range(num_ranks)]
        return [[(s.prompt, s.sample) for s in mb] for mb in ordered if mb is not None]

    assert composition(1) == composition(2) == composition(3) == composition(5)


def test_global_num_tokens() -> None:
    assert global_num_tokens(step_samples()) == sum(1 + (p + s) % 4 for p in range(3)
                                                     for s in range(2))


def test_pack_aligns_targets_logprobs_and_advantages() -> None:
    a, b = sample(0, 0, num_prompt=2, num_response=3), sample(0, 1, num_prompt=3, num_response=1)
    batch = pack([a, b], pad_token_id=0)
    assert batch.input_ids.shape == (2, 5)
    assert batch.input_ids[0].tolist() == a.prompt_tokens + a.response_tokens
    assert batch.input_ids[1].tolist() == b.prompt_tokens + b.response_tokens + [0]
    assert batch.attention_mask.tolist() == [[1] * 5, [1, 1, 1, 1, 0]]
    assert batch.loss_mask.tolist() == [[False, True, True, True, False],
                                        [False, False, True, False, False]]
    assert batch.targets[0][batch.loss_mask[0]].tolist() == a.response_tokens
    assert batch.targets[1][batch.loss_mask[1]].tolist() == b.response_tokens
    assert batch.old_logprobs[0][batch.loss_mask[0]].tolist() == pytest.approx(
        a.behavior_logprobs)
    assert batch.advantages[1].tolist() == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert batch.num_tokens == 4
    assert batch.old_logprobs.dtype == torch.float32 and batch.loss_mask.dtype == torch.bool


def test_response_mask_keeps_environment_tokens_out_of_the_loss() -> None:
    plain = sample(0, 0, num_prompt=2, num_response=4)
    episode = sample(0, 1, num_prompt=2, num_response=4)
    episode.response_mask = [1, 0, 0, 1]  # turn, observation (2 tokens), turn
    batch = pack([plain, episode])
    assert batch.loss_mask[1].tolist() == [False, True, False, False, True, False]
    assert batch.targets[1][batch.loss_mask[1]].tolist() == [episode.response_tokens[0],
                                                             episode.response_tokens[3]]
    assert batch.advantages[1][2:4].tolist() == [0.0, 0.0]
    assert batch.old_logprobs[1][2:4].tolist() == [0.0, 0.0]
    assert batch.loss_mask[0].tolist() == pack([plain]).loss_mask[0].tolist()
    assert global_num_tokens([plain, episode]) == 4 + 2 == batch.num_tokens
    episode.response_mask = [1, 0]
    with pytest.raises(ValueError, match="mask"):
        pack([episode])


def test_pack_rejects_bad_samples() -> None:
    with pytest.raises(ValueError):
        pack([])
    with pytest.raises(ValueError):
        pack([sample(0, 0, num_prompt=0)])
    bad = sample(0, 0)
    bad.behavior_logprobs = bad.behavior_logprobs[:-1]
    with pytest.raises(ValueError):
        pack([bad])
    assert pack([sample(0, 0, num_response=0)]).num_tokens == 0
